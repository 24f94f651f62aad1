//! The columnar load of a track (`track.rs` rule 1) against the track grown one event at a
//! time from the reader's decoded events (each vnode's events once, in log order, vnode after
//! vnode): on arbitrary logs, with events repeated inside one log, logs that disagree, steals,
//! returns, program inputs and values in the value store, both give the same G, the same
//! conflicts, G_S, structural errors and leaves; and so do both grown by more events. Every
//! leaf is also the hash of rule 4's fields one by one under a key derived for it.

use std::sync::Arc;

use proptest::prelude::*;
use veriflow_certifier::track::ValueSource;
use veriflow_certifier::Track;
use veriflow_runtime::log::{
    write_generation, Declared, Event, LogReader, Manifest, Output, Payload, RunStatus,
};
use veriflow_runtime::{DataId, Digest, MemoryStore, Store, TaskId, VnodeId};

/// Few ids, digests and names, so that logs meet and disagree.
fn task() -> impl Strategy<Value = TaskId> {
    (0..6u128).prop_map(|i| TaskId(i << 100 | i))
}

fn data() -> impl Strategy<Value = DataId> {
    (0..6u128).prop_map(|i| DataId(i << 120 | 7))
}

fn digest() -> impl Strategy<Value = Digest> {
    (0..3u8).prop_map(|b| Digest([b; 32]))
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        prop::collection::vec(0..2u8, 0..3).prop_map(Payload::Inline),
        (digest(), 0..3u64).prop_map(|(digest, len)| Payload::Stored { digest, len }),
    ]
}

fn output() -> impl Strategy<Value = Output> {
    (data(), payload(), digest()).prop_map(|(data, value, digest)| Output {
        data,
        value,
        digest,
    })
}

fn declared() -> impl Strategy<Value = Declared> {
    (
        task(),
        prop::option::of(task()),
        0..3u32,
        prop::sample::select(vec!["a", "bb"]),
        payload(),
        prop::collection::vec(data(), 0..3),
        prop::collection::vec(data(), 0..3),
    )
        .prop_map(
            |(task, parent, index, name, args, inputs, outputs)| Declared {
                task,
                parent,
                index,
                name: name.into(),
                args,
                inputs,
                outputs,
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => declared().prop_map(Event::Declared),
        3 => (task(), prop::collection::vec(digest(), 0..3))
            .prop_map(|(task, inputs)| Event::Started { task, inputs }),
        3 => (
            task(),
            prop::collection::vec(output(), 0..3),
            prop::collection::vec(task(), 0..3),
        )
            .prop_map(|(task, outputs, children)| Event::Completed {
                task,
                outputs,
                children,
            }),
        1 => (task(), 0..3u32).prop_map(|(task, v)| Event::Stolen {
            task,
            thief: VnodeId(v),
        }),
        1 => (0..3u32, declared(), prop::collection::vec(payload(), 0..3)).prop_map(
            |(v, record, inputs)| Event::Adopted {
                victim: VnodeId(v),
                record,
                inputs,
            }
        ),
        1 => output().prop_map(|output| Event::Returned { output }),
        1 => output().prop_map(|output| Event::Input { output }),
    ]
}

/// The logs of 1 to 3 vnodes, some events logged twice in a row or later again.
fn logs() -> impl Strategy<Value = Vec<Vec<Event>>> {
    prop::collection::vec(
        prop::collection::vec((event(), 0..4u8), 0..24).prop_map(|evs| {
            let mut log: Vec<Event> = Vec::new();
            for (e, again) in evs {
                log.push(e.clone());
                if again == 0 {
                    log.push(e);
                } else if again == 1 && !log.is_empty() {
                    log.push(log[log.len() / 2].clone());
                }
            }
            log
        }),
        1..4,
    )
}

/// Rule 4's leaf as first written: the key derived for this leaf, each field hashed in turn
/// from the task's view.
fn leaf_field_by_field(t: &Track, i: u32) -> [u8; 32] {
    let rec = t.task(i);
    let mut h = blake3::Hasher::new_derive_key("veriflow certifier leaf v1");
    h.update(&rec.id.0.to_le_bytes());
    if let Some(r) = &rec.record {
        h.update(&(r.name.len() as u64).to_le_bytes());
        h.update(r.name.as_bytes());
        h.update(&r.args.digest().0);
        h.update(&(r.inputs.len() as u64).to_le_bytes());
        let started = rec.started.clone().unwrap_or_default();
        for (k, d) in r.inputs.iter().enumerate() {
            h.update(&d.0.to_le_bytes());
            h.update(&started.get(k).copied().unwrap_or_default().0);
        }
    }
    let wrote = rec.wrote.clone().unwrap_or_default();
    h.update(&(wrote.len() as u64).to_le_bytes());
    for o in &wrote {
        h.update(&o.data.0.to_le_bytes());
        h.update(&o.digest.0);
    }
    h.update(&(rec.children.len() as u64).to_le_bytes());
    for c in &rec.children {
        h.update(&c.0.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// Everything a certifier reads of a track, by task id (indexes differ between the two).
fn seen(t: &Track, terminal: &[DataId]) -> String {
    let mut out = String::new();
    let mut ixs: Vec<u32> = (0..t.len() as u32).collect();
    ixs.sort_by_key(|&i| t.id(i));
    let leaves = t.leaves();
    for &i in &ixs {
        out += &format!("{:?} {:02x?}\n", t.task(i), &leaves[i as usize][..4]);
        out += &format!(
            "  inputs {:?}\n",
            t.input_values(i).map_err(|e| e.to_string())
        );
    }
    let mut data: Vec<DataId> = t.data_ids().collect();
    data.sort();
    for d in data {
        let rec = t.data(d).unwrap();
        let writer = rec.writer.map(|w| t.id(w));
        out += &format!(
            "{d:?} {writer:?} {:?} {:?} {:?}\n",
            rec.digest, rec.input, rec.returned
        );
        out += &format!("  value {:?}\n", t.value(d));
    }
    let (gs, errors) = t.terminal_subgraph(terminal);
    let gs_ids: Vec<TaskId> = gs.iter().map(|&i| t.id(i)).collect();
    out += &format!(
        "G_S {gs_ids:?}\n{errors:?}\n{:?}\n",
        t.structural_check(&gs)
    );
    out += &format!("conflicts {:?}\nevents {}\n", t.conflicts, t.events);
    out += &format!(
        "roots {:02x?} {:02x?}\n",
        t.merkle_root(&gs),
        t.log_digest()
    );
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_columnar_load_is_the_track_of_the_events_one_by_one(
        logs in logs(),
        terminal in prop::collection::vec(data(), 0..3),
        later in prop::collection::vec(event(), 0..6),
    ) {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
        let mut manifest = Manifest {
            program: "test".to_string(),
            root: TaskId(0),
            root_name: "a".to_string(),
            root_args: Vec::new(),
            inputs: Vec::new(),
            terminal: terminal.clone(),
            vnodes: logs.len() as u32,
            seed: 0,
            status: RunStatus::Finished,
            tool_version: String::new(),
            generation: 0,
        };
        let logs: Vec<(VnodeId, Vec<Event>)> = logs
            .into_iter()
            .enumerate()
            .map(|(v, events)| (VnodeId(v as u32), events))
            .collect();
        write_generation(&*store, &mut manifest, 1, &logs).unwrap();
        let reader = LogReader::latest(store.clone()).unwrap();
        prop_assert_eq!(reader.generation(), 1);
        let mut loaded = Track::load_from(&reader).unwrap();
        let mut one_by_one = Track::live(reader.manifest().unwrap(), 1);
        one_by_one.store = Some(ValueSource(store.clone()));
        for v in reader.vnodes().unwrap() {
            for e in reader.read_vnode(v).unwrap().events {
                one_by_one.absorb(v, e.event);
            }
        }
        prop_assert_eq!(loaded.len(), one_by_one.len());
        prop_assert_eq!(seen(&loaded, &terminal), seen(&one_by_one, &terminal));
        let leaves = loaded.leaves();
        for i in 0..loaded.len() as u32 {
            prop_assert_eq!(leaves[i as usize], leaf_field_by_field(&loaded, i));
            prop_assert_eq!(loaded.leaf(i), leaves[i as usize]);
        }
        // A loaded track grown further (its indexes no longer ranks) is still the same G.
        for e in later {
            loaded.absorb(VnodeId(0), e.clone());
            one_by_one.absorb(VnodeId(0), e);
        }
        prop_assert_eq!(seen(&loaded, &terminal), seen(&one_by_one, &terminal));
    }
}
