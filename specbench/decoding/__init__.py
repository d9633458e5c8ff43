"""The decode core: engine loop, acceptance rules, sampling, the method interface, stop criteria, per-example metrics."""
