#!/usr/bin/env python3
"""Imitates Ledgerbook, a small legacy accounting program that has no API, only files.

Its books live in a CSV file (--books). It talks to the world the way such programs do:
it writes exports into a folder, and it takes import files from a watched folder.

  ledgerbook.py export --books B --out DIR [--chunk-delay S]
      writes DIR/invoices-YYYYMMDDTHHMMSS.fffZ.csv (UTC time in the name): cp1252, ';'
      separated, CRLF line ends, columns Invoice;Date;Customer;Amount;Currency;Status;Batch.
      While writing it keeps DIR/NAME.lck; --chunk-delay writes slowly, 50 rows at a time.
      Prints the file name.
  ledgerbook.py import --books B --inbox DIR --processed DIR
      takes every batch-NAME.csv in the inbox (dot files are ignored: they are someone's
      temporary files): cp1252, ',' separated, columns invoice,date,customer,amount,currency.
      An invoice already in the books is skipped; a row that does not parse is rejected
      (listed on stderr). New invoices are added with status "open" and batch NAME, then
      the file is moved to the processed folder. Prints "batch NAME: added A of N".
  ledgerbook.py void --books B --batch NAME
      removes every invoice of a batch (an accountant's correction). Prints the count.
  ledgerbook.py serve --books B --out DIR --inbox DIR --processed DIR [--every S]
      runs both on a schedule until interrupted: an export every S seconds (default 60)
      and the inbox polled every second. For running by hand.

The books are created with six invoices on first use. Exits 2 on bad usage.
"""

import argparse
import csv
import datetime
import os
import sys
import tempfile
import time

COLUMNS = ["invoice", "date", "customer", "amount", "currency", "status", "batch"]
EXPORT_HEADER = ["Invoice", "Date", "Customer", "Amount", "Currency", "Status", "Batch"]
IMPORT_COLUMNS = ["invoice", "date", "customer", "amount", "currency"]
SEED = [
    ["INV-1001", "2024-04-02", "Müller GmbH", "1250.00", "EUR", "paid", "opening"],
    ["INV-1002", "2024-04-09", "Société Lumière", "380.50", "EUR", "open", "opening"],
    ["INV-1003", "2024-04-15", "Acme Corp", "2200.00", "USD", "open", "opening"],
    ["INV-1004", "2024-04-21", "Müller GmbH", "99.90", "EUR", "open", "opening"],
    ["INV-1005", "2024-05-03", "Øresund Shipping", "15000.00", "EUR", "paid", "opening"],
    ["INV-1006", "2024-05-07", "Acme Corp", "410.00", "USD", "paid", "opening"],
]


def load(books):
    """The invoices in the books, creating the books with the seed invoices if missing."""
    if not os.path.exists(books):
        save(books, SEED)
    with open(books, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    return rows[1:]


def save(books, rows):
    """Replace the books atomically."""
    folder = os.path.dirname(os.path.abspath(books))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".books-")
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    os.replace(tmp, books)


def export(books, out, chunk_delay=0.0):
    rows = load(books)
    os.makedirs(out, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    name = f"invoices-{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z.csv"
    path = os.path.join(out, name)
    lock = path + ".lck"
    with open(lock, "w") as f:
        f.write(str(os.getpid()))
    try:
        with open(path, "w", newline="", encoding="cp1252") as f:
            writer = csv.writer(f, delimiter=";", lineterminator="\r\n")
            writer.writerow(EXPORT_HEADER)
            for start in range(0, len(rows), 50):
                writer.writerows(rows[start:start + 50])
                if chunk_delay:
                    f.flush()
                    time.sleep(chunk_delay)
    finally:
        os.unlink(lock)
    print(name)


def import_inbox(books, inbox, processed):
    rows = load(books)
    known = {row[0] for row in rows}
    os.makedirs(processed, exist_ok=True)
    for name in sorted(os.listdir(inbox)):
        if name.startswith(".") or not (name.startswith("batch-") and name.endswith(".csv")):
            continue
        batch = name[len("batch-"):-len(".csv")]
        path = os.path.join(inbox, name)
        added = total = 0
        with open(path, newline="", encoding="cp1252") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != IMPORT_COLUMNS:
                print(f"{name}: unexpected columns {reader.fieldnames}", file=sys.stderr)
                continue
            for record in reader:
                total += 1
                try:
                    datetime.date.fromisoformat(record["date"])
                    float(record["amount"])
                except ValueError:
                    print(f"{name}: rejected {record['invoice']}: bad date or amount", file=sys.stderr)
                    continue
                if record["invoice"] in known:
                    continue
                known.add(record["invoice"])
                rows.append([record["invoice"], record["date"], record["customer"], record["amount"],
                             record["currency"], "open", batch])
                added += 1
        save(books, rows)
        os.replace(path, os.path.join(processed, name))
        print(f"batch {batch}: added {added} of {total}")


def void(books, batch):
    rows = load(books)
    kept = [row for row in rows if row[6] != batch]
    save(books, kept)
    print(f"voided {len(rows) - len(kept)}")


def main():
    parser = argparse.ArgumentParser(prog="ledgerbook", description="A small legacy accounting program.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export")
    p.add_argument("--books", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--chunk-delay", type=float, default=0.0)
    p = sub.add_parser("import")
    p.add_argument("--books", required=True)
    p.add_argument("--inbox", required=True)
    p.add_argument("--processed", required=True)
    p = sub.add_parser("void")
    p.add_argument("--books", required=True)
    p.add_argument("--batch", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--books", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--inbox", required=True)
    p.add_argument("--processed", required=True)
    p.add_argument("--every", type=float, default=60.0)
    args = parser.parse_args()
    if args.command == "export":
        export(args.books, args.out, args.chunk_delay)
    elif args.command == "import":
        import_inbox(args.books, args.inbox, args.processed)
    elif args.command == "void":
        void(args.books, args.batch)
    else:
        os.makedirs(args.inbox, exist_ok=True)
        last = 0.0
        while True:
            if time.monotonic() - last >= args.every:
                export(args.books, args.out)
                last = time.monotonic()
            import_inbox(args.books, args.inbox, args.processed)
            sys.stdout.flush()
            time.sleep(1)


if __name__ == "__main__":
    main()
