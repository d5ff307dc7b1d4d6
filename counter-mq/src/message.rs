//! The message format: what a publisher sends and a consumer applies.
//!
//! One message is one JSON object, a version, an idempotency id, a counter
//! table and its changes:
//!
//! ```json
//! {"v":1,"id":"0192f4c1-7c1e-7d4e-9a51-3f0e2b7c9d10","t":"post_counters",
//!  "d":[[17,"likes",1],[17,"views",40,1764201600],["a-slug","views",-2]]}
//! ```
//!
//! * `v`: the format version, `1`. A consumer rejects versions it does not
//!   know instead of guessing.
//! * `id`: 1 to 128 printable ASCII characters without spaces, unique per
//!   event or per flush (a UUIDv7, or `<writer>:<seq>:<part>` from a
//!   buffered publisher). The consumer applies each id once per source: an
//!   id names one message for good, and a later message reusing it is
//!   skipped as a duplicate whatever it carries.
//! * `t`: the counter table, one the consumer registered.
//! * `d`: up to [`MAX_CHANGES`] changes `[owner, key, delta]` or
//!   `[owner, key, delta, at]`: the owner as JSON of the table's owner type
//!   (a number, or a string for string and UUID owners), the key, a delta in
//!   `i64`, and for a windowed key the Unix second the event happened at
//!   (its bucket; the consumer's clock when absent), 1970 to 9999.
//!
//! * `o` (optional, beside or instead of `d`): observations of unique keys
//!   `[owner, key, member]` or `[owner, key, member, at]`: the member (a
//!   user id, a session, an IP address) as a string, counted once among the
//!   key's distinct members (see counter-core's `Counters::observe`).
//!   Counting a member is idempotent by nature, so a redelivered
//!   observation could not double anything; it shares the id anyway, so
//!   one message can carry a page view (`views` + 1) and its viewer at once.
//!   `d` and `o` together hold 1 to [`MAX_CHANGES`] entries.
//!
//! Subjects (JetStream) and routing keys (RabbitMQ) carry no meaning for
//! the consumer: the table is in the message.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::Rejection;

/// The format version this crate writes and reads.
pub const VERSION: u64 = 1;
/// The largest message a consumer decodes; a larger one is rejected before
/// it is parsed.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// The most changes one message may carry.
pub const MAX_CHANGES: usize = 10_000;
/// The longest message id.
pub const MAX_ID_LEN: usize = 128;
/// The latest `at` a message may carry (the last second of year 9999);
/// the earliest is 1970. A hostile time cannot make buckets centuries away.
pub const MAX_AT: i64 = 253_402_300_799;

/// One change: `delta` to `key` of `owner`, at a time for windowed keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The owner id as JSON: a number, or a string (string and UUID owners).
    pub owner: Json,
    /// The counter key.
    pub key: String,
    /// The delta.
    pub delta: i64,
    /// When the event happened (its time bucket, for a windowed key).
    pub at: Option<DateTime<Utc>>,
}

/// One member observed into a unique key: `[owner, key, member]` or
/// `[owner, key, member, at]` on the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The owner, as JSON of the table's owner type.
    pub owner: Json,
    /// The unique key.
    pub key: String,
    /// The member, counted once however often it is observed.
    pub member: String,
    /// When it was observed: the bucket of a windowed key (the consumer's
    /// clock when absent).
    pub at: Option<DateTime<Utc>>,
}

/// A message: an id, a counter table, and changes and observations of that
/// table. Build one with [`CounterMessage::new`], [`CounterMessage::push`]
/// and [`CounterMessage::push_observation`], or let a
/// [`Publish`](crate::Publish)er build it.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterMessage {
    id: String,
    table: String,
    changes: Vec<Change>,
    observations: Vec<Observation>,
}

/// The JSON shape (see the module documentation).
#[derive(Serialize, Deserialize)]
struct Wire {
    v: u64,
    id: String,
    t: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    d: Vec<WireChange>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    o: Vec<WireObservation>,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireObservation {
    Now(Json, String, String),
    At(Json, String, String, i64),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireChange {
    Now(Json, String, i64),
    At(Json, String, i64, i64),
}

impl CounterMessage {
    /// An empty message for `table` with a new UUIDv7 id.
    pub fn new(table: impl Into<String>) -> Self {
        Self::with_id(uuid::Uuid::now_v7().to_string(), table)
    }

    /// An empty message for `table` with the id `id` (checked when sent).
    pub fn with_id(id: impl Into<String>, table: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            table: table.into(),
            changes: Vec::new(),
            observations: Vec::new(),
        }
    }

    /// Adds an observation of a unique key.
    pub fn push_observation(&mut self, observation: Observation) -> &mut Self {
        self.observations.push(observation);
        self
    }

    /// The observations of unique keys.
    pub fn observations(&self) -> &[Observation] {
        &self.observations
    }

    /// Adds a change. It is checked by the consumer, against the table it
    /// registered (a message with a bad change is rejected whole);
    /// [`Publish::publish`](crate::Publish::publish) checks one against a
    /// handle before sending.
    pub fn push(&mut self, change: Change) -> &mut Self {
        self.changes.push(change);
        self
    }

    /// Gives the message another id (checked when it is sent).
    pub(crate) fn set_id(&mut self, id: &str) {
        id.clone_into(&mut self.id);
    }

    /// The idempotency id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The counter table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The changes.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// The JSON bytes sent to the broker; refused if the id or the number of
    /// changes is out of bounds, so nothing a consumer must reject is sent.
    pub fn encode(&self) -> Result<Vec<u8>, Rejection> {
        check_id(&self.id)?;
        check_count(self.changes.len() + self.observations.len())?;
        let wire = Wire {
            v: VERSION,
            id: self.id.clone(),
            t: self.table.clone(),
            d: self
                .changes
                .iter()
                .map(|c| match c.at {
                    Some(at) => {
                        WireChange::At(c.owner.clone(), c.key.clone(), c.delta, at.timestamp())
                    }
                    None => WireChange::Now(c.owner.clone(), c.key.clone(), c.delta),
                })
                .collect(),
            o: self
                .observations
                .iter()
                .map(|o| {
                    let (owner, key, member) = (o.owner.clone(), o.key.clone(), o.member.clone());
                    match o.at {
                        Some(at) => WireObservation::At(owner, key, member, at.timestamp()),
                        None => WireObservation::Now(owner, key, member),
                    }
                })
                .collect(),
        };
        let bytes = serde_json::to_vec(&wire).map_err(|e| Rejection::Malformed(e.to_string()))?;
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(Rejection::TooLarge(bytes.len()));
        }
        Ok(bytes)
    }

    /// Parses `bytes`: the format, version, id, change count and times.
    /// Tables, owners and keys are checked by the consumer's
    /// [`Tables`](crate::Tables), which knows their types.
    pub fn decode(bytes: &[u8]) -> Result<Self, Rejection> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(Rejection::TooLarge(bytes.len()));
        }
        // The version first, so a future format is reported as such and
        // not as malformed.
        #[derive(Deserialize)]
        struct Version {
            v: u64,
        }
        let version: Version =
            serde_json::from_slice(bytes).map_err(|e| Rejection::Malformed(e.to_string()))?;
        if version.v != VERSION {
            return Err(Rejection::UnsupportedVersion(version.v));
        }
        let wire: Wire =
            serde_json::from_slice(bytes).map_err(|e| Rejection::Malformed(e.to_string()))?;
        check_id(&wire.id)?;
        check_count(wire.d.len() + wire.o.len())?;
        let changes = wire
            .d
            .into_iter()
            .map(|change| {
                Ok(match change {
                    WireChange::Now(owner, key, delta) => Change {
                        owner,
                        key,
                        delta,
                        at: None,
                    },
                    WireChange::At(owner, key, delta, at) => Change {
                        owner,
                        key,
                        delta,
                        at: Some(time(at)?),
                    },
                })
            })
            .collect::<Result<_, Rejection>>()?;
        let observations = wire
            .o
            .into_iter()
            .map(|observation| {
                Ok(match observation {
                    WireObservation::Now(owner, key, member) => Observation {
                        owner,
                        key,
                        member,
                        at: None,
                    },
                    WireObservation::At(owner, key, member, at) => Observation {
                        owner,
                        key,
                        member,
                        at: Some(time(at)?),
                    },
                })
            })
            .collect::<Result<_, Rejection>>()?;
        Ok(Self {
            id: wire.id,
            table: wire.t,
            changes,
            observations,
        })
    }
}

/// A Unix second of the wire as a time, 1970 to 9999.
fn time(at: i64) -> Result<DateTime<Utc>, Rejection> {
    (0..=MAX_AT)
        .contains(&at)
        .then(|| DateTime::from_timestamp(at, 0))
        .flatten()
        .ok_or(Rejection::BadTime(at))
}

/// Whether `id` can be a message (or idempotency) id: 1 to [`MAX_ID_LEN`]
/// printable ASCII characters, no space. Ids are stored in an `ascii_bin`
/// column on MySQL, so ids differing in case stay distinct and no trailing
/// space can make two ids compare equal.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_graphic())
}

/// [`is_valid_id`], as a rejection.
pub(crate) fn check_id(id: &str) -> Result<(), Rejection> {
    if is_valid_id(id) {
        Ok(())
    } else {
        Err(Rejection::BadId(id.chars().take(MAX_ID_LEN + 8).collect()))
    }
}

fn check_count(got: usize) -> Result<(), Rejection> {
    if (1..=MAX_CHANGES).contains(&got) {
        Ok(())
    } else {
        Err(Rejection::ChangeCount {
            got,
            max: MAX_CHANGES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_time() {
        let mut message = CounterMessage::with_id("w1:7", "post_counters");
        message.push(Change {
            owner: 17.into(),
            key: "likes".into(),
            delta: -3,
            at: None,
        });
        message.push(Change {
            owner: "slug".into(),
            key: "views".into(),
            delta: i64::MAX,
            at: DateTime::from_timestamp(1_764_201_600, 0),
        });
        let bytes = message.encode().unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"v":1,"id":"w1:7","t":"post_counters","d":[[17,"likes",-3],["slug","views",9223372036854775807,1764201600]]}"#
        );
        assert_eq!(CounterMessage::decode(&bytes).unwrap(), message);
    }

    #[test]
    fn observations_round_trip_beside_changes_or_alone() {
        let mut message = CounterMessage::with_id("view:9", "post_counters");
        message.push(Change {
            owner: 17.into(),
            key: "views".into(),
            delta: 1,
            at: None,
        });
        message.push_observation(Observation {
            owner: 17.into(),
            key: "viewers".into(),
            member: "user:42".into(),
            at: DateTime::from_timestamp(1_764_201_600, 0),
        });
        let bytes = message.encode().unwrap();
        assert_eq!(
            std::str::from_utf8(&bytes).unwrap(),
            r#"{"v":1,"id":"view:9","t":"post_counters","d":[[17,"views",1]],"o":[[17,"viewers","user:42",1764201600]]}"#
        );
        assert_eq!(CounterMessage::decode(&bytes).unwrap(), message);
        let alone = br#"{"v":1,"id":"a","t":"t","o":[["p","viewers",""]]}"#;
        let decoded = CounterMessage::decode(alone).unwrap();
        assert_eq!(
            (decoded.changes().len(), decoded.observations().len()),
            (0, 1)
        );
        let nothing = br#"{"v":1,"id":"a","t":"t"}"#;
        assert!(matches!(
            CounterMessage::decode(nothing),
            Err(Rejection::ChangeCount { got: 0, .. })
        ));
        let number_member = br#"{"v":1,"id":"a","t":"t","o":[[1,"viewers",42]]}"#;
        assert!(matches!(
            CounterMessage::decode(number_member),
            Err(Rejection::Malformed(_))
        ));
    }

    #[test]
    fn hostile_messages_are_rejected_by_kind() {
        type Expect = fn(&Rejection) -> bool;
        let cases: &[(&[u8], Expect)] = &[
            (b"not json", |r| matches!(r, Rejection::Malformed(_))),
            (br#"{"v":2,"id":"a","t":"x","d":[]}"#, |r| {
                *r == Rejection::UnsupportedVersion(2)
            }),
            (br#"{"v":1,"id":"","t":"x","d":[[1,"k",1]]}"#, |r| {
                matches!(r, Rejection::BadId(_))
            }),
            (br#"{"v":1,"id":"a b","t":"x","d":[[1,"k",1]]}"#, |r| {
                matches!(r, Rejection::BadId(_))
            }),
            (br#"{"v":1,"id":"a","t":"x","d":[]}"#, |r| {
                matches!(r, Rejection::ChangeCount { got: 0, .. })
            }),
            (
                br#"{"v":1,"id":"a","t":"x","d":[[1,"k",9223372036854775808]]}"#,
                |r| matches!(r, Rejection::Malformed(_)),
            ),
            (
                br#"{"v":1,"id":"a","t":"x","d":[[1,"k",1,99999999999999999]]}"#,
                |r| matches!(r, Rejection::BadTime(_)),
            ),
            (br#"{"v":1,"id":"a","t":"x","d":[[1,"k"]]}"#, |r| {
                matches!(r, Rejection::Malformed(_))
            }),
        ];
        for (bytes, expected) in cases {
            let got = CounterMessage::decode(bytes).unwrap_err();
            assert!(
                expected(&got),
                "{}: {got:?}",
                String::from_utf8_lossy(bytes)
            );
        }
        let deep = "[".repeat(10_000);
        assert!(matches!(
            CounterMessage::decode(deep.as_bytes()),
            Err(Rejection::Malformed(_))
        ));
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert_eq!(
            CounterMessage::decode(&big),
            Err(Rejection::TooLarge(MAX_MESSAGE_BYTES + 1))
        );
    }
}
