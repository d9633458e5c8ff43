"""Model pairs: loading from the hub or local folders, the built-in tiny and toy pairs, trained drafters."""
