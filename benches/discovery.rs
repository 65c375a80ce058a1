//! Discovery speed on the largest simulated host: an MI300X in cpx_nps4 mode
//! (8 GPUs, 64 partitions, about 5,000 sysfs files). Goal: under 20 ms on one core.
//! Discovery is single-threaded, so the figure is a one-core figure.

use criterion::{Criterion, criterion_group, criterion_main};
use gpu_operator::device::discover;
use gpu_operator::host::HostRoot;
use gpu_operator::simulate::{self, SimSpec};

fn bench_discovery(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let host = HostRoot::new(dir.path());
    let spec = SimSpec::new("mi300x", None, Some("cpx_nps4")).expect("profile");
    simulate::write_host(&host, &spec).expect("simulated host");
    assert_eq!(discover(&host).gpus.len(), 8);
    c.bench_function("discover mi300x cpx_nps4 (8 GPUs, 64 partitions)", |b| {
        b.iter(|| discover(&host))
    });
    let spec = SimSpec::new("mi300x", None, None).expect("profile");
    simulate::write_host(&host, &spec).expect("simulated host");
    c.bench_function("discover mi300x spx_nps1 (8 GPUs)", |b| {
        b.iter(|| discover(&host))
    });
}

criterion_group!(benches, bench_discovery);
criterion_main!(benches);
