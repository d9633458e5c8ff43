"""Reading finished runs back: the report, the papers' tables, figures."""
