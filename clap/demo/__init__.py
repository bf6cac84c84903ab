"""The demo-data generator (`clap demo-data`): a deterministic manufacturing world with realistic noise. Product code never imports it."""
