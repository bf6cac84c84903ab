"""The application chain: retrieval + prompt + model + parser, as replay and `clap serve` run it."""
