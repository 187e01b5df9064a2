"""merging package."""
