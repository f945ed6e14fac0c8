"""proposers package."""
