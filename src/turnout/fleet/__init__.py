"""The live view of the worker fleet: health, inventory, residency, load and learned speed."""
