"""Money as every command and page prints it (CLI, report, dashboard): cents from a dollar up, three
significant digits under a dollar, so that a cost per item of $0.0000608 is never shown as "$0.0001"."""

from __future__ import annotations

import math

SIGNIFICANT = 3


def usd(value: float) -> str:
    """``$1,234.50``, ``$0.123``, ``$0.0000608``, ``$0.00``.

    >>> usd(0.0000608)
    '$0.0000608'
    """
    size = abs(value)
    sign = "-" if value < 0 else ""
    if size >= 1 or size == 0:
        return f"{sign}${size:,.2f}"
    decimals = max(2, SIGNIFICANT - 1 - math.floor(math.log10(size)))
    text = f"{size:.{decimals}f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"{sign}${whole}.{cents.ljust(2, '0')}"
