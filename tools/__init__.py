"""Maintenance commands, outside the installed package: the docs' reference generator, the fingerprint recorder."""
