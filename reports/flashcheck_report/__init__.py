"""flashcheck's report, by role: load (records in, checked against
docs/record.schema.json), aggregate (accuracy, bench, the baseline comparison,
the summary), plots (matplotlib) and render (report.html from templates/,
summary.md, summary.json). reports/report.py is the entry point."""
