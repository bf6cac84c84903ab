"""Training: LoRA/QLoRA SFT, its runtime diagnosis and the TBDL detector, and the GRPO failure-boundary probe."""
