//! What image garbage collection knows of each image (upstream
//! `pkg/kubelet/images/image_gc_manager.go`: `imageRecord`, `detectImages`, `freeSpace`):
//! when the kubelet first saw it, when it last saw a container use it, its size and whether
//! the runtime pins it.
//!
//! The trick it carries is the minimum age (`--minimum-image-ttl-duration`, `MinAge`, 2
//! minutes by default): an image first seen less than that long ago is not removed, even
//! unused under disk pressure, since it was most likely just pulled for a pod about to
//! start; removing it would only have it pulled again. The records live in memory only: a
//! restarted kubelet sees every image anew, at its start, so an image is never removed
//! sooner than the minimum age after a restart either (upstream since 1.30,
//! kubernetes/kubernetes#123343; before, images present at start counted as infinitely
//! old). Images are detected when the manager starts, every [`DETECT_PERIOD`], and at each
//! collection.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::cri::api;

/// `--minimum-image-ttl-duration`'s default (`KubeletConfiguration.ImageMinimumGCAge`,
/// `pkg/kubelet/apis/config/v1beta1/defaults.go`: 2 minutes): long enough for a pulled
/// image to get the container it was pulled for.
pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(2 * 60);

/// How often images are detected besides each collection (`realImageGCManager.Start`'s
/// `wait.Until(..., 5*time.Minute)`): an image's first sighting is at most this late, which
/// only ever makes it look younger than it is.
pub const DETECT_PERIOD: Duration = Duration::from_secs(5 * 60);

/// One image's record (`imageRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageRecord {
    /// When it was first detected.
    pub first_detected: Instant,
    /// When a container was last seen using it; `None`: never.
    pub last_used: Option<Instant>,
    /// Its size in bytes.
    pub size: u64,
    /// Whether the runtime pins it, or it is the sandbox image: never removed.
    pub pinned: bool,
}

/// The records of every image the runtime has, by image ID.
#[derive(Debug)]
pub struct ImageRecords {
    min_age: Duration,
    records: HashMap<String, ImageRecord>,
    last_detection: Option<Instant>,
}

impl ImageRecords {
    /// No records yet, removing nothing younger than `min_age`.
    pub fn new(min_age: Duration) -> ImageRecords {
        ImageRecords {
            min_age,
            records: HashMap::new(),
            last_detection: None,
        }
    }

    /// Whether the periodic detection is due at `now`: never done, or [`DETECT_PERIOD`]
    /// ago.
    pub fn detection_due(&self, now: Instant) -> bool {
        self.last_detection
            .is_none_or(|t| now.saturating_duration_since(t) >= DETECT_PERIOD)
    }

    /// `detectImages` at `now`: an image not known yet is first detected now, one a container
    /// uses (`in_use`: image IDs) is last used now, sizes and pins are brought up to date,
    /// and the records of images gone are dropped. `pinned_tags` are pinned too (the sandbox
    /// image).
    pub fn detect(
        &mut self,
        images: &[api::Image],
        in_use: &HashSet<String>,
        pinned_tags: &[String],
        now: Instant,
    ) {
        let mut current = HashSet::new();
        for image in images {
            current.insert(image.id.as_str());
            let record = self.records.entry(image.id.clone()).or_insert(ImageRecord {
                first_detected: now,
                last_used: None,
                size: 0,
                pinned: false,
            });
            if in_use.contains(&image.id) {
                record.last_used = Some(now);
            }
            record.size = image.size;
            record.pinned = image.pinned || image.repo_tags.iter().any(|t| pinned_tags.contains(t));
        }
        self.records.retain(|id, _| current.contains(id.as_str()));
        self.last_detection = Some(now);
    }

    /// The images a collection at `free_time` (right after [`ImageRecords::detect`] at
    /// that time) may remove, in upstream's order (least recently used first, then first
    /// detected first): not pinned, not used at `free_time`, and first detected at least the
    /// minimum age before it (`freeSpace`). With their sizes.
    pub fn removable(&self, free_time: Instant) -> Vec<(String, u64)> {
        let mut candidates: Vec<(&String, &ImageRecord)> = self
            .records
            .iter()
            .filter(|(_, r)| !r.pinned)
            .filter(|(_, r)| r.last_used.is_none_or(|u| u < free_time))
            .filter(|(_, r)| free_time.saturating_duration_since(r.first_detected) >= self.min_age)
            .collect();
        candidates.sort_by(|(ia, a), (ib, b)| {
            let by_use = match (a.last_used, b.last_used) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Less,
                (Some(_), None) => Ordering::Greater,
                (Some(x), Some(y)) => x.cmp(&y),
            };
            by_use
                .then(a.first_detected.cmp(&b.first_detected))
                .then(ia.cmp(ib))
        });
        candidates
            .into_iter()
            .map(|(id, r)| (id.clone(), r.size))
            .collect()
    }

    /// Forgets a removed image.
    pub fn removed(&mut self, id: &str) {
        self.records.remove(id);
    }

    /// The record of `id`.
    pub fn get(&self, id: &str) -> Option<&ImageRecord> {
        self.records.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, size: u64, tags: &[&str]) -> api::Image {
        api::Image {
            id: id.to_string(),
            size,
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn young_used_and_pinned_images_stay() {
        let start = Instant::now();
        let mut r = ImageRecords::new(DEFAULT_MIN_AGE);
        assert!(r.detection_due(start));
        let old = image("sha256:old", 10, &["old:1"]);
        let used = image("sha256:used", 20, &["used:1"]);
        let pause = image("sha256:pause", 1, &["skerry.local/pause:1"]);
        let pins = ["skerry.local/pause:1".to_string()];
        r.detect(
            &[old.clone(), used.clone(), pause.clone()],
            &HashSet::new(),
            &pins,
            start,
        );
        assert!(!r.detection_due(start + DETECT_PERIOD / 2));
        assert!(r.detection_due(start + DETECT_PERIOD));
        // Pulled a minute later: one minute old when the disk runs short three minutes in.
        let later = start + Duration::from_secs(60);
        let young = image("sha256:young", 30, &["young:1"]);
        let all = [old.clone(), used.clone(), pause.clone(), young.clone()];
        r.detect(&all, &HashSet::new(), &pins, later);
        let free_time = start + Duration::from_secs(150);
        r.detect(
            &all,
            &HashSet::from(["sha256:used".to_string()]),
            &pins,
            free_time,
        );
        assert_eq!(
            r.removable(free_time),
            vec![("sha256:old".to_string(), 10)],
            "young is 90 s old, used is in use, pause is pinned"
        );
        assert_eq!(r.get("sha256:young").map(|y| y.first_detected), Some(later));
        // Once old enough, the young one goes too; the one used 150 s in goes after it,
        // least recently used first.
        let much_later = start + Duration::from_secs(400);
        r.detect(&all, &HashSet::new(), &pins, much_later);
        assert_eq!(
            r.removable(much_later),
            vec![
                ("sha256:old".to_string(), 10),
                ("sha256:young".to_string(), 30),
                ("sha256:used".to_string(), 20),
            ]
        );
        r.removed("sha256:old");
        assert!(r.get("sha256:old").is_none());
        // An image the runtime no longer has is forgotten.
        r.detect(&[young], &HashSet::new(), &pins, much_later);
        assert!(r.get("sha256:used").is_none());
    }

    #[test]
    fn a_restart_sees_every_image_anew() {
        // A new set of records (a restarted kubelet) first detects an image at its start:
        // it is not removed before the minimum age has passed since.
        let restart = Instant::now();
        let mut r = ImageRecords::new(Duration::from_secs(120));
        let old = image("sha256:old", 10, &[]);
        r.detect(std::slice::from_ref(&old), &HashSet::new(), &[], restart);
        let soon = restart + Duration::from_secs(10);
        r.detect(std::slice::from_ref(&old), &HashSet::new(), &[], soon);
        assert!(r.removable(soon).is_empty());
        let after = restart + Duration::from_secs(120);
        assert_eq!(r.removable(after), vec![("sha256:old".to_string(), 10)]);
        // A zero minimum age removes what is unused at once.
        let mut zero = ImageRecords::new(Duration::ZERO);
        zero.detect(std::slice::from_ref(&old), &HashSet::new(), &[], restart);
        assert_eq!(zero.removable(restart).len(), 1);
    }
}
