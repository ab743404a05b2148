"""The admin JSON API (and, later, the web UI built on it)."""
