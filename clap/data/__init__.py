"""The data half of the loop: raw exports -> typed assets (assetize) -> canonical facts (normalize) -> admitted splits (admission)."""
