"""Fakes for the one-interface-per-axis adapters (style.md): one fake per interface."""
