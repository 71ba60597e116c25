//! A simulated kube-apiserver for tests, benchmarks and the demo.
