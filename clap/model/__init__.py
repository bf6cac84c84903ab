"""The pinned base model (export, loading, adapter files) and batched greedy decoding."""
