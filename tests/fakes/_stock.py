"""The rows every fake exporter in this folder writes: a small stock list.

Not a program: a module the fake exporters import, so their rows agree.
"""

import datetime

HEADER = ["sku", "date", "qty", "price", "status", "name"]
NAMES = ["Widget", "Gadget", "Müller Schraube", "Crème brûlée", "Ørsted Kabel", "Sprocket"]


def row(i):
    """The i-th row as text cells: retired every tenth, dates cycling through January 2024."""
    day = datetime.date(2024, 1, 1) + datetime.timedelta(days=i % 31)
    return [f"SKU-{i:05d}", day.isoformat(), str(i % 50), f"{(i % 1000) / 4:.2f}",
            "retired" if i % 10 == 0 else "active", NAMES[i % len(NAMES)]]
