"""The `lousho demo`: a scripted trip planner that survives a crash and pauses for an approval."""
