"""The pure core: rules and decisions with no I/O, no logging and no clock of their own.

Nothing in this package imports a framework or another part of Turnout (import-linter checks it).
Adapters (gateway, fleet, admin, state) call into it with plain values.
"""
