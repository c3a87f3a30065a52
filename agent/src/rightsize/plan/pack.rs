//! MIG instances onto as few GPUs as the placement rules allow.
//!
//! A GPU holds a set of instances when each sits at one of its profile's placements, no two
//! share a memory slice, and their compute slices add up to no more than the GPU's. The
//! sets one GPU can hold ("configurations") are found by trying every placement; then:
//! - **exact** where the demand is small (at most `EXACT_STATES` demand vectors below it):
//!   the fewest GPUs by dynamic programming over the demand, one configuration per GPU;
//! - **first-fit decreasing** beyond: instances largest first (memory slices, then compute
//!   slices), each at the first free placement of the first GPU it fits, else a new GPU.
//!
//! Either way each GPU's free slices are then cut into more devices of the profiles it
//! already has, largest first, while they fit: spare devices for replicas to grow into,
//! and fewer distinct layouts to configure.
use std::collections::HashMap;

use crate::rightsize::profiles::{ModelProfiles, Placement};

/// Demand vectors (the product of each profile's count + 1) up to which the packing is
/// exact.
pub const EXACT_STATES: usize = 20_000;

/// One profile as the packing sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub slices: u32,
    pub placements: Vec<Placement>,
}

impl Shape {
    fn size(&self) -> u32 {
        self.placements.first().map_or(0, |p| p.size)
    }
}

/// One GPU of a packing: each device's shape (its index in the shapes given) and placement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Gpu {
    pub devices: Vec<(usize, Placement)>,
}

impl Gpu {
    /// The memory slices its devices take, as bits.
    fn mask(&self) -> u64 {
        (self.devices.iter()).fold(0, |m, (_, p)| m | bits(*p))
    }

    /// How many devices of each shape it holds.
    pub fn counts(&self, shapes: usize) -> Vec<u32> {
        let mut c = vec![0; shapes];
        for (s, _) in &self.devices {
            c[*s] += 1;
        }
        c
    }
}

/// The packing: its GPUs, and whether their number is the least possible.
#[derive(Debug, Clone, PartialEq)]
pub struct Packing {
    pub gpus: Vec<Gpu>,
    pub exact: bool,
}

/// The GPU's rules: its shapes, compute slices and memory slices.
pub struct Rules {
    pub shapes: Vec<Shape>,
    pub total_slices: u32,
    pub memory_slices: u32,
}

impl Rules {
    /// The model's profiles named in `profiles`, in that order. None: one has no
    /// placements (or is not the model's).
    pub fn of(model: &ModelProfiles, profiles: &[String]) -> Option<Rules> {
        let shapes = (profiles.iter())
            .map(|n| {
                let p = model.profile(n).filter(|p| !p.placements.is_empty())?;
                Some(Shape {
                    slices: p.slices,
                    placements: p.placements.clone(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        (model.memory_slices > 0 && model.memory_slices <= 64).then_some(Rules {
            shapes,
            total_slices: model.total_slices,
            memory_slices: model.memory_slices,
        })
    }

    /// Where shape `s` can go on `gpu`: its first placement that overlaps nothing, within
    /// the GPU's memory and compute slices.
    fn fit(&self, gpu: &Gpu, s: usize) -> Option<Placement> {
        if self.compute(gpu) + self.shapes[s].slices > self.total_slices {
            return None;
        }
        let mask = gpu.mask();
        (self.shapes[s].placements.iter())
            .find(|p| p.start + p.size <= self.memory_slices && mask & bits(**p) == 0)
            .copied()
    }

    /// The compute slices `gpu`'s devices take.
    pub fn compute(&self, gpu: &Gpu) -> u32 {
        (gpu.devices.iter())
            .map(|(d, _)| self.shapes[*d].slices)
            .sum()
    }

    /// Every set of devices one GPU can hold, as counts per shape with one placement of
    /// each, keeping only those no other holds more of.
    fn configurations(&self) -> Vec<Gpu> {
        let mut all: Vec<Gpu> = vec![];
        self.extend(&mut Gpu::default(), 0, &mut all);
        let n = self.shapes.len();
        let counts: Vec<Vec<u32>> = all.iter().map(|g| g.counts(n)).collect();
        let dominated = |i: usize| {
            (0..all.len()).any(|j| {
                j != i
                    && counts[j] != counts[i]
                    && counts[j].iter().zip(&counts[i]).all(|(a, b)| a >= b)
            })
        };
        let mut keep: Vec<(Vec<u32>, Gpu)> = vec![];
        for (i, g) in all.iter().enumerate() {
            if !dominated(i) && !keep.iter().any(|(c, _)| *c == counts[i]) {
                keep.push((counts[i].clone(), g.clone()));
            }
        }
        keep.into_iter().map(|(_, g)| g).collect()
    }

    /// Adds to `gpu` each shape from `from` on, in every free placement, recording every
    /// set reached.
    fn extend(&self, gpu: &mut Gpu, from: usize, out: &mut Vec<Gpu>) {
        if !gpu.devices.is_empty() {
            out.push(gpu.clone());
        }
        for s in from..self.shapes.len() {
            if self.compute(gpu) + self.shapes[s].slices > self.total_slices {
                continue;
            }
            let mask = gpu.mask();
            // Only placements after this shape's last one: each set is reached once.
            let after = (gpu.devices.iter())
                .filter(|(d, _)| *d == s)
                .map(|(_, p)| p.start + 1)
                .max()
                .unwrap_or(0);
            for p in &self.shapes[s].placements {
                let fits = p.start >= after
                    && p.start + p.size <= self.memory_slices
                    && mask & bits(*p) == 0;
                if fits {
                    gpu.devices.push((s, *p));
                    self.extend(gpu, s, out);
                    gpu.devices.pop();
                }
            }
        }
    }

    /// Cuts `gpu`'s free slices into more devices of the shapes it has, largest first.
    fn pad(&self, gpu: &mut Gpu) {
        let mut have: Vec<usize> = gpu.devices.iter().map(|(s, _)| *s).collect();
        have.sort_by_key(|s| std::cmp::Reverse((self.shapes[*s].size(), self.shapes[*s].slices)));
        have.dedup();
        for s in have {
            while let Some(p) = self.fit(gpu, s) {
                gpu.devices.push((s, p));
            }
        }
        gpu.devices.sort_by_key(|(_, p)| p.start);
    }
}

/// The memory slices a placement takes, as bits.
fn bits(p: Placement) -> u64 {
    let ones = if p.size >= 64 {
        u64::MAX
    } else {
        (1u64 << p.size) - 1
    };
    ones.checked_shl(p.start).unwrap_or(0)
}

/// `demand[s]` devices of each shape onto GPUs under `rules`.
pub fn pack(rules: &Rules, demand: &[u32]) -> Packing {
    if demand.iter().all(|d| *d == 0) {
        return Packing {
            gpus: vec![],
            exact: true,
        };
    }
    let states = demand
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d as usize + 1))
        .unwrap_or(usize::MAX);
    let mut packing = match states <= EXACT_STATES {
        true => exact(rules, demand),
        false => first_fit(rules, demand),
    };
    for g in &mut packing.gpus {
        rules.pad(g);
    }
    packing
}

/// The fewest GPUs: f(d) = 1 + min over configurations c of f(max(d - c, 0)).
fn exact(rules: &Rules, demand: &[u32]) -> Packing {
    let configs = rules.configurations();
    let n = rules.shapes.len();
    let counts: Vec<Vec<u32>> = configs.iter().map(|g| g.counts(n)).collect();
    let mut memo: HashMap<Vec<u32>, (u32, usize)> = HashMap::new();
    fewest(demand.to_vec(), &counts, &mut memo);
    let mut gpus = vec![];
    let mut d = demand.to_vec();
    while d.iter().any(|x| *x > 0) {
        let Some(&(_, c)) = memo.get(&d) else {
            // A shape no configuration holds: none fits a GPU. Cannot happen for a model's
            // own profiles; left to the heuristic, which says the same.
            return first_fit(rules, demand);
        };
        // Only the devices the demand still asks for; `pad` fills the rest.
        let mut left = d.clone();
        let mut gpu = Gpu::default();
        for (s, p) in &configs[c].devices {
            if left[*s] > 0 {
                left[*s] -= 1;
                gpu.devices.push((*s, *p));
            }
        }
        gpus.push(gpu);
        d = left;
    }
    Packing { gpus, exact: true }
}

/// f(d) for `fewest`, memoised with the configuration chosen.
fn fewest(d: Vec<u32>, counts: &[Vec<u32>], memo: &mut HashMap<Vec<u32>, (u32, usize)>) -> u32 {
    if d.iter().all(|x| *x == 0) {
        return 0;
    }
    if let Some((f, _)) = memo.get(&d) {
        return *f;
    }
    let mut best = (u32::MAX, usize::MAX);
    for (i, c) in counts.iter().enumerate() {
        if !c.iter().zip(&d).any(|(c, d)| *c > 0 && *d > 0) {
            continue;
        }
        let rest: Vec<u32> = d.iter().zip(c).map(|(d, c)| d.saturating_sub(*c)).collect();
        let f = fewest(rest, counts, memo).saturating_add(1);
        if f < best.0 {
            best = (f, i);
        }
    }
    memo.insert(d, best);
    best.0
}

/// Largest first, each at the first GPU and placement it fits.
fn first_fit(rules: &Rules, demand: &[u32]) -> Packing {
    let mut order: Vec<usize> = (0..demand.len()).collect();
    order.sort_by_key(|s| std::cmp::Reverse((rules.shapes[*s].size(), rules.shapes[*s].slices)));
    let mut gpus: Vec<Gpu> = vec![];
    for s in order {
        for _ in 0..demand[s] {
            let placed = gpus.iter_mut().any(|g| match rules.fit(g, s) {
                Some(p) => {
                    g.devices.push((s, p));
                    true
                }
                None => false,
            });
            if !placed {
                let mut g = Gpu::default();
                match rules.fit(&g, s) {
                    Some(p) => g.devices.push((s, p)),
                    // A shape that fits no GPU: nothing to place it on.
                    None => continue,
                }
                gpus.push(g);
            }
        }
    }
    Packing { gpus, exact: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rightsize::profiles::Profiles;

    const H100: &str = "NVIDIA H100 80GB HBM3";

    fn rules(model: &str, names: &[&str]) -> Rules {
        let p = Profiles::table();
        let m = p.for_model(model, None).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        Rules::of(m, &names).unwrap()
    }

    fn gpus(model: &str, demand: &[(&str, u32)]) -> usize {
        let names: Vec<&str> = demand.iter().map(|(n, _)| *n).collect();
        let r = rules(model, &names);
        let d: Vec<u32> = demand.iter().map(|(_, c)| *c).collect();
        let p = pack(&r, &d);
        assert!(p.exact);
        check(&r, &p, &d);
        p.gpus.len()
    }

    /// Every GPU valid (placements its shape allows, no two devices on one memory slice,
    /// compute within the GPU's) and the demand met.
    fn check(r: &Rules, p: &Packing, demand: &[u32]) {
        let mut placed = vec![0; demand.len()];
        for g in &p.gpus {
            let mut mask = 0u64;
            for (s, pl) in &g.devices {
                assert!(r.shapes[*s].placements.contains(pl), "{g:?}");
                assert_eq!(mask & bits(*pl), 0, "overlap: {g:?}");
                assert!(pl.start + pl.size <= r.memory_slices, "{g:?}");
                mask |= bits(*pl);
                placed[*s] += 1;
            }
            assert!(r.compute(g) <= r.total_slices, "{g:?}");
        }
        for (p, d) in placed.iter().zip(demand) {
            assert!(p >= d, "placed {placed:?} of {demand:?}");
        }
    }

    #[test]
    fn the_h100_known_answers() {
        // Two 3g.40gb per GPU: three need two GPUs.
        assert_eq!(gpus(H100, &[("3g.40gb", 3)]), 2);
        assert_eq!(gpus(H100, &[("4g.40gb", 1), ("3g.40gb", 1)]), 1);
        // 2g.20gb starts at 0, 2 or 4: three per GPU, not four.
        assert_eq!(gpus(H100, &[("2g.20gb", 4)]), 2);
        assert_eq!(gpus(H100, &[("2g.20gb", 3)]), 1);
        assert_eq!(gpus(H100, &[("1g.10gb", 7)]), 1);
        assert_eq!(gpus(H100, &[("1g.10gb", 8)]), 2);
        // 1g.20gb takes two memory slices: four per GPU, compute to spare.
        assert_eq!(gpus(H100, &[("1g.20gb", 4)]), 1);
        assert_eq!(gpus(H100, &[("1g.20gb", 5)]), 2);
        assert_eq!(gpus(H100, &[("4g.40gb", 2)]), 2);
        // 3g.40gb at 4 leaves 0-3 to two 2g.20gb.
        assert_eq!(gpus(H100, &[("2g.20gb", 2), ("3g.40gb", 1)]), 1);
        assert_eq!(
            gpus(H100, &[("1g.10gb", 1), ("2g.20gb", 1), ("4g.40gb", 1)]),
            1
        );
    }

    #[test]
    fn the_a100_40gb_and_the_a30() {
        let a100 = "NVIDIA A100-SXM4-40GB";
        assert_eq!(gpus(a100, &[("3g.20gb", 3)]), 2);
        assert_eq!(gpus(a100, &[("1g.5gb", 7)]), 1);
        assert_eq!(gpus(a100, &[("1g.5gb", 3), ("4g.20gb", 1)]), 1);
        assert_eq!(gpus(a100, &[("1g.10gb", 4), ("1g.5gb", 1)]), 2);
        let a30 = "NVIDIA A30";
        assert_eq!(gpus(a30, &[("2g.12gb", 2)]), 1);
        assert_eq!(gpus(a30, &[("1g.6gb", 2), ("2g.12gb", 1)]), 1);
        assert_eq!(gpus(a30, &[("4g.24gb", 2)]), 2);
    }

    #[test]
    fn first_fit_beyond_the_exact_size_and_padding_fills_the_gpu() {
        // Largest first puts 3g.40gb at 0, and the second 2g.20gb has nowhere to go: the
        // heuristic needs a GPU more than the exact packing.
        let r = rules(H100, &["2g.20gb", "3g.40gb"]);
        let ffd = first_fit(&r, &[2, 1]);
        assert_eq!(ffd.gpus.len(), 2);
        check(&r, &ffd, &[2, 1]);
        assert_eq!(pack(&r, &[2, 1]).gpus.len(), 1);
        // Many instances: the heuristic, still valid.
        let r = rules(H100, &["1g.10gb", "3g.40gb"]);
        let p = pack(&r, &[400, 300]);
        assert!(!p.exact);
        check(&r, &p, &[400, 300]);
        // Two 3g.40gb take a GPU's 8 memory slices: 150 GPUs; 400 1g.10gb, 58 more.
        assert_eq!(p.gpus.len(), 150 + 58);
        // One 3g.40gb alone: the GPU's other half becomes a spare 3g.40gb.
        let r = rules(H100, &["3g.40gb"]);
        let p = pack(&r, &[1]);
        assert_eq!(p.gpus[0].counts(1), [2]);
    }

    /// xorshift64*: a small seeded generator, so that a failure can be replayed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn property_packings_are_valid_never_above_the_instances_and_exact_beats_first_fit() {
        let models = [
            (
                H100,
                vec!["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"],
            ),
            ("NVIDIA A30", vec!["1g.6gb", "2g.12gb", "4g.24gb"]),
        ];
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let (model, all) = &models[rng.below(2) as usize];
            let names: Vec<&str> = all.iter().copied().filter(|_| rng.below(2) == 0).collect();
            if names.is_empty() {
                continue;
            }
            let r = rules(model, &names);
            let demand: Vec<u32> = names.iter().map(|_| rng.below(6) as u32).collect();
            let p = pack(&r, &demand);
            check(&r, &p, &demand);
            let instances: u32 = demand.iter().sum();
            assert!(p.gpus.len() as u32 <= instances, "seed {seed}: {demand:?}");
            let ffd = first_fit(&r, &demand);
            check(&r, &ffd, &demand);
            assert!(p.gpus.len() <= ffd.gpus.len(), "seed {seed}");
            // No packing beats the GPU's compute or memory slices.
            let compute: u32 = (demand.iter().zip(&r.shapes))
                .map(|(d, s)| d * s.slices)
                .sum();
            let memory: u32 = (demand.iter().zip(&r.shapes))
                .map(|(d, s)| d * s.size())
                .sum();
            let bound = compute
                .div_ceil(r.total_slices)
                .max(memory.div_ceil(r.memory_slices));
            assert!(p.gpus.len() as u32 >= bound, "seed {seed}");
        }
    }
}
