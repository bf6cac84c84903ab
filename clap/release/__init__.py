"""Release control: signed approvals, release/rollback, the handoff bundle, and `clap verify` (reproducing a commit)."""
