"""patching package."""
