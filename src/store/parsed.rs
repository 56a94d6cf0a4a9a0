//! What a store has parsed of the JSON it keeps ([`Parsed`]), by text: read by every
//! scheduling pass (`super::resources`).

use std::collections::HashMap;
use std::sync::Arc;

use crate::resources::{Demand, Placement};

/// The demands and placements a store has read, by their stored JSON text: every scheduling
/// pass reads those of each job holding quota and of each candidate (about 7,000 at 10,000
/// waiting on 1,000 nodes), most of them the same few texts (jobs of one shape), parsed once.
/// Text to value is pure, so nothing is ever stale; the maps are emptied when they grow past
/// [`Parsed::MAX`] texts.
#[derive(Debug, Default)]
pub struct Parsed {
    /// A job's `demands` column (one per task), each demand shared.
    demands: HashMap<String, Vec<Arc<Demand>>>,
    placements: HashMap<String, Arc<Placement>>,
}

impl Parsed {
    /// Most texts kept of each kind.
    pub const MAX: usize = 4096;

    /// Task `task`'s demand in a `demands` column's `text`; None when there is none.
    pub fn demand(&mut self, text: &str, task: i64) -> Option<Arc<Demand>> {
        let at = |list: &Vec<Arc<Demand>>| {
            usize::try_from(task)
                .ok()
                .and_then(|t| list.get(t))
                .cloned()
        };
        if let Some(list) = self.demands.get(text) {
            return at(list);
        }
        let list: Vec<Demand> = serde_json::from_str(text).ok()?;
        let list: Vec<Arc<Demand>> = list.into_iter().map(Arc::new).collect();
        let found = at(&list);
        Self::keep(&mut self.demands, text, list);
        found
    }

    /// The placement `text` stands for; None when it is not one.
    pub fn placement(&mut self, text: &str) -> Option<Arc<Placement>> {
        if let Some(p) = self.placements.get(text) {
            return Some(p.clone());
        }
        let p = Arc::new(serde_json::from_str(text).ok()?);
        Self::keep(&mut self.placements, text, Arc::clone(&p));
        Some(p)
    }

    fn keep<T>(map: &mut HashMap<String, T>, text: &str, value: T) {
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(text.to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored demands column gives each task's demand, the same value for the same text,
    /// None past its tasks or for text that is no list of demands; the kept texts stay bounded.
    #[test]
    fn demands_are_parsed_once_per_text() {
        let mut parsed = Parsed::default();
        let text = r#"[{"m":1,"r":{"cpu":1000}},{"m":4,"r":{"nvidia.com/gpu":8000}}]"#;
        let second = parsed.demand(text, 1).unwrap();
        assert_eq!(
            (second.members, second.per_member.get("nvidia.com/gpu")),
            (4, 8000)
        );
        assert!(Arc::ptr_eq(&second, &parsed.demand(text, 1).unwrap()));
        assert_eq!(parsed.demand(text, 0).unwrap().per_member.get("cpu"), 1000);
        assert_eq!(parsed.demand(text, 2), None);
        assert_eq!(parsed.demand(text, -1), None);
        assert_eq!(parsed.demand("not json", 0), None);
        for i in 0..Parsed::MAX + 10 {
            parsed
                .demand(&format!(r#"[{{"m":{i},"r":{{}}}}]"#), 0)
                .unwrap();
        }
        assert!(parsed.demands.len() <= Parsed::MAX);
    }
}
