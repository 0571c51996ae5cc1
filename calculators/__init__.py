"""Pure formulas for ZeRO training memory and communication.

Nothing in this package does I/O or imports a framework (fastapi, torch): it takes frozen
dataclasses and plain numbers and returns byte counts as integers. ``tests/calculators``
enforces the purity rule.
"""
