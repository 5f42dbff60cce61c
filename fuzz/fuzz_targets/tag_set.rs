//! The tag set (`plugio_engine::tag::TagSet`, the sbitmap) against a
//! model, the set of tags held: random options and a random sequence of
//! single, batch and flush-style gets and single and batch frees from
//! random cores. A tag is never handed out twice, is always below the
//! depth, `busy()` is the number held, a single get or a short flush-style
//! get fails only when every tag is held, and options are refused exactly
//! when out of range.

#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use plugio_engine::tag::{Tag, TagError, TagOptions, TagSet};

#[derive(Debug, Arbitrary)]
struct Options {
    depth: u16,
    nr_cores: u8,
    round_robin: bool,
    batch: bool,
    batch_retry: bool,
    deferred_clear: bool,
    shift: Option<u8>,
    wake_batch: Option<u16>,
    wait_queues: u8,
}

#[derive(Debug, Arbitrary)]
enum Op {
    Get { core: u8 },
    GetBatch { core: u8, nr: u8 },
    GetTags { core: u8, nr: u8 },
    Put { core: u8, pick: u16 },
    PutBatch { core: u8, picks: Vec<u16> },
}

#[derive(Debug, Arbitrary)]
struct Input {
    options: Options,
    ops: Vec<Op>,
}

fn build(o: &Options) -> (u32, TagOptions, Result<TagSet, TagError>) {
    let depth = u32::from(o.depth % 600);
    let options = TagOptions {
        nr_cores: usize::from(o.nr_cores % 5),
        round_robin: o.round_robin,
        batch: o.batch,
        batch_retry: o.batch_retry,
        deferred_clear: o.deferred_clear,
        shift: o.shift.map(|s| u32::from(s % 9)),
        wake_batch: o.wake_batch.map(|w| u32::from(w % 700)),
        wait_queues: usize::from(o.wait_queues % 10),
    };
    let set = TagSet::new(depth, options.clone());
    (depth, options, set)
}

/// Whether `TagSet::new` must refuse (the `TagError` rules).
fn invalid(depth: u32, o: &TagOptions) -> bool {
    depth == 0
        || o.nr_cores == 0
        || o.shift.is_some_and(|s| s > 6)
        || o.wake_batch.is_some_and(|w| w == 0 || w > depth)
        || o.wait_queues == 0
        || o.wait_queues > plugio_engine::tag::MAX_WAIT_QUEUES
}

fn take(held: &mut BTreeSet<u32>, depth: u32, tag: Tag) {
    assert!(
        tag.as_u32() < depth,
        "tag {} beyond depth {depth}",
        tag.as_u32()
    );
    assert!(
        held.insert(tag.as_u32()),
        "tag {} handed out twice",
        tag.as_u32()
    );
}

fn run(input: &Input) {
    let (depth, options, set) = build(&input.options);
    let set = match set {
        Ok(set) => {
            assert!(!invalid(depth, &options), "accepted {depth} {options:?}");
            set
        }
        Err(e) => {
            assert!(
                invalid(depth, &options),
                "refused {depth} {options:?}: {e:?}"
            );
            return;
        }
    };
    let mut held = BTreeSet::new();
    for op in &input.ops {
        match *op {
            Op::Get { core } => match set.get(usize::from(core)) {
                Some(tag) => take(&mut held, depth, tag),
                None => assert_eq!(held.len() as u32, depth, "get failed with tags free"),
            },
            Op::GetBatch { core, nr } => {
                if let Some((offset, mask)) = set.get_batch(usize::from(core), u32::from(nr)) {
                    assert!(mask != 0 && mask.count_ones() <= u32::from(nr).min(64));
                    for i in (0..64).filter(|i| mask & (1 << i) != 0) {
                        take(&mut held, depth, Tag::new(offset + i));
                    }
                }
            }
            Op::GetTags { core, nr } => {
                let mut out = Vec::new();
                let got = set.get_tags(usize::from(core), usize::from(nr), &mut out);
                assert_eq!(got, out.len());
                for tag in out {
                    take(&mut held, depth, tag);
                }
                if got < usize::from(nr) {
                    assert_eq!(held.len() as u32, depth, "short get with tags free");
                }
            }
            Op::Put { core, pick } => {
                if let Some(&t) = held.iter().nth(usize::from(pick) % held.len().max(1)) {
                    held.remove(&t);
                    set.put(usize::from(core), Tag::new(t));
                }
            }
            Op::PutBatch { core, ref picks } => {
                let mut tags = Vec::new();
                for &pick in picks {
                    if let Some(&t) = held.iter().nth(usize::from(pick) % held.len().max(1)) {
                        held.remove(&t);
                        tags.push(Tag::new(t));
                    }
                }
                set.put_batch(usize::from(core), &tags);
            }
        }
        assert_eq!(set.busy(), held.len() as u32, "busy() is not the tags held");
    }
}

fuzz_target!(|input: Input| run(&input));
