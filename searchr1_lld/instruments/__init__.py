"""The LLD instruments: likelihood metrics of each step, the probe set, and the phase detector with its alarms."""
