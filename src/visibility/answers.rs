//! The answers of the queue path, kept per computed queue ([`Generation`]): each caller's cut
//! ([`Slice`]) is serialized once, compressed with gzip for callers that accept it, and served
//! as bytes until the next queue is computed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, header};

use super::view;

/// One computation of the queue over every namespace, and the answers cut from it so far.
pub(super) struct Generation {
    /// When its store reads began.
    pub(super) at: Instant,
    /// The queue over every namespace.
    pub(super) all: Arc<view::JobQueue>,
    /// The answers cut from it (a caller's view, serialized), so that a caller polling the
    /// queue costs a copy of bytes, not a cut and a serialization of 10,000 jobs per request.
    pub(super) answers: Mutex<Answers>,
}

/// The answers of a [`Generation`], by what they show: each one, and whether a caller asked
/// for it (only those are cut again from the next generation).
#[derive(Default)]
pub(super) struct Answers {
    pub(super) by_slice: HashMap<Slice, (Answer, bool)>,
    /// Their bytes in all (at most [`ANSWER_BYTES_KEPT`]).
    pub(super) bytes: usize,
}

/// What a `JobQueue` answer shows: the caller's namespaces (None: all), `?queue=`,
/// `?limit=`; and whether the caller accepts it compressed with gzip.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(super) struct Slice {
    pub(super) visible: Option<BTreeSet<String>>,
    pub(super) queue: Option<String>,
    pub(super) limit: Option<usize>,
    pub(super) gzip: bool,
}

/// An answer as sent: JSON, compressed with gzip or not.
#[derive(Clone, Debug)]
pub(super) struct Answer {
    pub(super) body: Bytes,
    pub(super) gzip: bool,
}

/// Answers from this size on are compressed for a caller that accepts gzip (the API server's
/// own threshold for its responses): a queue of 10,000 jobs is about 5 MB of JSON and 300 to
/// 400 kB compressed, so each request costs an eighth of the TLS encryption and copying.
const GZIP_FROM_BYTES: usize = 128 * 1024;

/// The request accepts an answer compressed with gzip (`Accept-Encoding: gzip` or `*`, not
/// with `q=0`).
pub(super) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            (name.eq_ignore_ascii_case("gzip") || name == "*")
                && !parts.any(|p| {
                    p.strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q <= 0.0)
                })
        })
}

impl Slice {
    /// `all` cut down to this slice ([`view::restrict`]), as JSON, compressed when the caller
    /// accepts it and it is large ([`GZIP_FROM_BYTES`]); the time each step took is logged at
    /// debug level (target `managed_jobs::visibility`).
    pub(super) fn answer(&self, all: &view::JobQueue) -> std::io::Result<Answer> {
        let start = Instant::now();
        let shown = view::restrict(
            all,
            self.visible.as_ref(),
            self.queue.as_deref(),
            self.limit,
        );
        let restrict_ms = ms(start);
        let serialized = Instant::now();
        let json = serde_json::to_vec(&shown)?;
        let serialize_ms = ms(serialized);
        let compressed = Instant::now();
        let bytes = json.len();
        let answer = if self.gzip && json.len() >= GZIP_FROM_BYTES {
            use std::io::Write as _;
            // The fastest level: 5 MB of a queue's JSON in tens of ms, about 15 times smaller.
            let mut gz = flate2::write::GzEncoder::new(
                Vec::with_capacity(json.len() / 8),
                flate2::Compression::fast(),
            );
            gz.write_all(&json)?;
            Answer {
                body: Bytes::from(gz.finish()?),
                gzip: true,
            }
        } else {
            Answer {
                body: Bytes::from(json),
                gzip: false,
            }
        };
        tracing::debug!(
            restrict_ms,
            serialize_ms,
            gzip_ms = answer.gzip.then(|| ms(compressed)),
            waiting = shown.waiting.len(),
            bytes,
            sent_bytes = answer.body.len(),
            "visibility API: queue answer cut"
        );
        Ok(answer)
    }
}

impl Generation {
    /// The answer kept for `slice`, if any, for a caller.
    pub(super) fn kept(&self, slice: &Slice) -> Option<Answer> {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let (answer, asked) = answers.by_slice.get_mut(slice)?;
        *asked = true;
        Some(answer.clone())
    }

    /// Keeps `answer` as `slice`'s (`asked`: by a caller; else cut ahead), unless that would
    /// pass [`ANSWER_BYTES_KEPT`].
    pub(super) fn keep(&self, slice: Slice, answer: &Answer, asked: bool) {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        let len = answer.body.len();
        if answers.bytes + len <= ANSWER_BYTES_KEPT && !answers.by_slice.contains_key(&slice) {
            answers.bytes += len;
            answers.by_slice.insert(slice, (answer.clone(), asked));
        }
    }

    /// The slices callers asked for.
    pub(super) fn asked(&self) -> Vec<Slice> {
        let answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        answers
            .by_slice
            .iter()
            .filter(|(_, (_, asked))| *asked)
            .map(|(slice, _)| slice.clone())
            .collect()
    }
}

/// Bytes of answers kept per [`Generation`] at most: a few callers' views of a queue of
/// 10,000 jobs (about 5 MB each). A caller past it is answered all the same, at the cost of
/// a cut and a serialization per request.
const ANSWER_BYTES_KEPT: usize = 32 << 20;

/// Milliseconds since `t`.
pub(super) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
