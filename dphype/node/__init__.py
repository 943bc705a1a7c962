"""What a node enforces on its own: its operator's privacy policy and its persistent ledger."""
