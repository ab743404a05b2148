"""Turnout: one OpenAI- and Ollama-compatible URL in front of every model a team runs."""

__version__ = "0.1.0"

__all__ = ["__version__"]
