"""Building blocks every other package may use: registries, option checks, files, progress bars,
flat configs and their differences, a run's numbers from its rows."""
