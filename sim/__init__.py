"""unikv.sim: a SimPy simulator that replays request traces against any pool layout."""
