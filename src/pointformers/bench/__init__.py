"""Speed / memory benchmarks, measured side by side in one run."""
