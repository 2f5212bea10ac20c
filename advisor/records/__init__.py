"""Records and wire format that cross the process boundary: torch-free, imported by both sides."""
