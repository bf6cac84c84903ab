"""pandera DataFrameModels, one module per artifact (validated by the stage that writes it)."""
