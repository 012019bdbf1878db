"""Renderers of results: rich console (plain lines off a terminal), HTML report, certification page,
and for CI JUnit XML and a Markdown step summary (``cases`` maps every results document to test cases)."""
