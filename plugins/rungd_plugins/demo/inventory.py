#!/usr/bin/env python3
"""Imitates a small legacy inventory CLI, the program the rungd demo wraps.

State lives in a JSON file (--db, default ./inventory.json), created with three items on first
use. Every command takes --db.

  inventory show ITEM [--new-format]
      prints "item: ...", "count: ..." and "location: ..." lines; --new-format prints a table
      instead, as a later release did, breaking every parser of the old format.
  inventory set ITEM COUNT
      asks "Set ITEM count from A to B? [y/N] " with no newline; "y" writes the file
      atomically and prints "ok"; anything else, end-of-file included, prints "aborted" and
      exits 1.
  inventory lie ITEM COUNT
      prints "ok" and exits 0, changing nothing: a program that reports success it did not
      achieve.

An unknown ITEM prints "no such item: ITEM" to stderr and exits 3.
"""

import argparse
import json
import os
import sys
import tempfile

DEFAULT_ITEMS = {
    "widget": {"count": 12, "location": "A-3"},
    "gadget": {"count": 5, "location": "B-1"},
    "sprocket": {"count": 40, "location": "C-7"},
}


def load(path):
    """The items in the state file, creating it with the default items if it is missing."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        save(path, DEFAULT_ITEMS)
        return DEFAULT_ITEMS


def save(path, items):
    """Replace the state file in one step, so a reader never sees half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".inventory-")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(items, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def find(items, name):
    """The record of item ``name``; exits 3 when there is none."""
    if name not in items:
        sys.stderr.write(f"no such item: {name}\n")
        sys.exit(3)
    return items[name]


def show(args):
    record = find(load(args.db), args.item)
    if args.new_format:
        print(f"{'ITEM':<12}{'QTY':>6}  {'BIN':<8}")
        print(f"{args.item:<12}{record['count']:>6}  {record['location']:<8}")
    else:
        print(f"item: {args.item}")
        print(f"count: {record['count']}")
        print(f"location: {record['location']}")


def set_count(args):
    items = load(args.db)
    record = find(items, args.item)
    sys.stdout.write(f"Set {args.item} count from {record['count']} to {args.count}? [y/N] ")
    sys.stdout.flush()
    if sys.stdin.readline().strip() != "y":
        print("aborted")
        sys.exit(1)
    record["count"] = args.count
    save(args.db, items)
    print("ok")


def lie(args):
    find(load(args.db), args.item)
    print("ok")


def count(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("COUNT must be zero or more")
    return value


common = argparse.ArgumentParser(add_help=False)
common.add_argument("--db", default="inventory.json", help="the JSON state file")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
commands = parser.add_subparsers(required=True, metavar="COMMAND")

show_parser = commands.add_parser("show", parents=[common], help="print one item")
show_parser.add_argument("item")
show_parser.add_argument("--new-format", action="store_true", help="print the newer table format")
show_parser.set_defaults(run=show)

for name, run, help in (
    ("set", set_count, "change an item's count, after confirmation"),
    ("lie", lie, "claim to change an item's count, changing nothing"),
):
    command = commands.add_parser(name, parents=[common], help=help)
    command.add_argument("item")
    command.add_argument("count", type=count)
    command.set_defaults(run=run)

args = parser.parse_args()
args.run(args)
