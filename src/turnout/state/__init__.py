"""Local state files: the atomic writer and the placement override file."""
