#!/usr/bin/env python3
"""inventory: a small legacy stock-keeping program, the way such programs were written.

It keeps its data in a JSON file, prints "key: value" lines, asks a person to confirm a
change with a [y/N] prompt (no newline, read from stdin), and signals errors with exit
statuses: 2 usage, 3 no such item. rungd's demo plugin wraps it.

    inventory --db FILE show ITEM
    inventory --db FILE set ITEM COUNT        asks "Set ITEM count from A to B? [y/N] "
    inventory --db FILE list
"""

import argparse
import json
import os
import sys

DEFAULT_STOCK = {
    "widget": {"count": 12, "location": "A-01"},
    "gadget": {"count": 3, "location": "B-07"},
    "sprocket": {"count": 0, "location": "C-12"},
}


def load(path):
    if not os.path.exists(path):
        save(path, DEFAULT_STOCK)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def save(path, stock):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(stock, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(prog="inventory")
    parser.add_argument("--db", default="inventory.json")
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("show")
    show.add_argument("item")
    setc = sub.add_parser("set")
    setc.add_argument("item")
    setc.add_argument("count", type=int)
    sub.add_parser("list")
    args = parser.parse_args()

    stock = load(args.db)
    if args.command == "list":
        for name in sorted(stock):
            print(f"{name}: {stock[name]['count']}")
        return 0
    if args.item not in stock:
        print(f"inventory: no such item: {args.item}", file=sys.stderr)
        return 3
    entry = stock[args.item]
    if args.command == "show":
        print(f"item: {args.item}")
        print(f"count: {entry['count']}")
        print(f"location: {entry['location']}")
        return 0
    sys.stdout.write(f"Set {args.item} count from {entry['count']} to {args.count}? [y/N] ")
    sys.stdout.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer != "y":
        print("aborted")
        return 1
    entry["count"] = args.count
    save(args.db, stock)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
