"""Studies: a TOML grid of runs, run on Ray with resume, into one Parquet
dataset (docs/studies.md). Needs the `study` extra (ray, pydantic,
pyarrow); import the submodules, this package imports nothing."""
