"""Alignment: find the group element that maps one model onto another's coordinates."""
