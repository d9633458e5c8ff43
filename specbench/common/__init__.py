"""Building blocks every other package may use: registries, option checks, files, progress bars,
a run's numbers from its rows."""
