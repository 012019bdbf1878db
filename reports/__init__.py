"""Renderers of results: rich console now; JSON-derived HTML and certification later."""
