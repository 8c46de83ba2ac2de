"""Experiments that reproduce the papers' findings, one command each (``cf-tasks experiment <name>``)."""
