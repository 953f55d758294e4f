//! Alarms: etcd's cluster-wide conditions that stop writes (`etcdserver/api/v3alarm`,
//! `etcdserver/apply.go`), kept in the store so every member applies them alike.
//!
//! An alarm is a `(member, type)` pair: `NOSPACE` (a member's backend passed its space
//! quota, see [`crate::quota`]) or `CORRUPT`. Raising and clearing one is a log command
//! (`Command::Alarm`), so every member changes its `alarms` table at the same log index, and
//! the table survives restarts, rides in snapshots and is what the apply path consults: while
//! an alarm is active, the writer applies commands the way etcd's alarm appliers do
//! ([`Applier`]). etcd swaps its applier in memory when an alarm is raised or cleared, and
//! rebuilds it from the alarm table only at start (`restoreAlarms`); with both alarms active,
//! clearing one gives it the plain applier until its next restart. Here the applier always
//! follows the table, as etcd's own start-up reading does, so members never disagree on how
//! to apply an entry.

use std::collections::BTreeSet;

use crate::pb::etcdserverpb::{AlarmMember, AlarmType};

/// How the apply path treats commands under the active alarms: etcd's chain of appliers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applier {
    /// No alarm: writes apply, puts, txns and lease grants are checked against this member's
    /// quota (`quotaApplierV3`).
    Normal,
    /// `NOSPACE` is active (`applierV3Capped`): puts, lease grants and txns with a put at
    /// their top level fail with `mvcc: database space exceeded`; deletes, compactions,
    /// revocations and other txns apply.
    Capped,
    /// `CORRUPT` is active (`applierV3Corrupt`): puts, deletes, txns, compactions, lease
    /// grants and revocations all fail with `corrupt cluster`. It takes precedence over
    /// `Capped`, as it does at etcd's start.
    Corrupt,
}

/// The active alarms, as `(type, member)` pairs in that order (the `alarms` table's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alarms {
    active: BTreeSet<(i32, u64)>,
}

impl Alarms {
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (i32, u64)>) -> Self {
        Alarms {
            active: pairs.into_iter().collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Whether any member has an alarm of `kind`.
    pub fn is_active(&self, kind: AlarmType) -> bool {
        self.active.iter().any(|(t, _)| *t == kind as i32)
    }

    /// The alarms of type `kind`, or every alarm for `NONE` (etcd's `AlarmStore.Get`), in
    /// type then member order. etcd lists them in Go's map order, which is random.
    pub fn list(&self, kind: i32) -> Vec<AlarmMember> {
        self.active
            .iter()
            .filter(|(t, _)| kind == AlarmType::None as i32 || *t == kind)
            .map(|(alarm, member_id)| AlarmMember {
                member_id: *member_id,
                alarm: *alarm,
            })
            .collect()
    }

    /// Every active alarm.
    pub fn all(&self) -> Vec<AlarmMember> {
        self.list(AlarmType::None as i32)
    }

    /// Records an alarm; false if it was active already.
    pub(crate) fn activate(&mut self, kind: i32, member: u64) -> bool {
        self.active.insert((kind, member))
    }

    /// Clears an alarm; false if it was not active.
    pub(crate) fn deactivate(&mut self, kind: i32, member: u64) -> bool {
        self.active.remove(&(kind, member))
    }

    pub(crate) fn applier(&self) -> Applier {
        if self.is_active(AlarmType::Corrupt) {
            Applier::Corrupt
        } else if self.is_active(AlarmType::Nospace) {
            Applier::Capped
        } else {
            Applier::Normal
        }
    }
}

/// An alarm as etcd writes it in `Status` errors (`AlarmMember.String()`, gogo protobuf's
/// compact text form): `memberID:<decimal> alarm:<NAME> `, trailing space included, fields
/// at their zero value left out, an unknown type as its number.
pub fn alarm_text(alarm: &AlarmMember) -> String {
    let mut out = String::new();
    if alarm.member_id != 0 {
        out.push_str(&format!("memberID:{} ", alarm.member_id));
    }
    if alarm.alarm != 0 {
        match AlarmType::try_from(alarm.alarm) {
            Ok(kind) => out.push_str(&format!("alarm:{} ", kind.as_str_name())),
            Err(_) => out.push_str(&format!("alarm:{} ", alarm.alarm)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applier_follows_the_active_alarms() {
        let mut alarms = Alarms::default();
        assert_eq!(alarms.applier(), Applier::Normal);
        assert!(alarms.activate(AlarmType::Nospace as i32, 7));
        assert!(!alarms.activate(AlarmType::Nospace as i32, 7));
        assert!(alarms.activate(AlarmType::Nospace as i32, 9));
        assert_eq!(alarms.applier(), Applier::Capped);
        assert!(alarms.activate(AlarmType::Corrupt as i32, 7));
        assert_eq!(alarms.applier(), Applier::Corrupt);
        // Clearing CORRUPT leaves NOSPACE in force (etcd's in-memory applier would be the
        // plain one until its next restart).
        assert!(alarms.deactivate(AlarmType::Corrupt as i32, 7));
        assert_eq!(alarms.applier(), Applier::Capped);
        assert!(alarms.deactivate(AlarmType::Nospace as i32, 7));
        assert_eq!(
            alarms.applier(),
            Applier::Capped,
            "member 9's alarm remains"
        );
        assert!(!alarms.deactivate(AlarmType::Nospace as i32, 7));
        assert!(alarms.deactivate(AlarmType::Nospace as i32, 9));
        assert_eq!(alarms.applier(), Applier::Normal);
        assert!(alarms.is_empty());
    }

    #[test]
    fn lists_filter_by_type_and_none_means_every_alarm() {
        let alarms = Alarms::from_pairs([(2, 5), (1, 9), (1, 3)]);
        let pairs = |list: Vec<AlarmMember>| -> Vec<(i32, u64)> {
            list.iter().map(|a| (a.alarm, a.member_id)).collect()
        };
        assert_eq!(pairs(alarms.all()), [(1, 3), (1, 9), (2, 5)]);
        assert_eq!(pairs(alarms.list(1)), [(1, 3), (1, 9)]);
        assert_eq!(pairs(alarms.list(2)), [(2, 5)]);
    }

    #[test]
    fn the_text_form_is_etcds() {
        // As etcd 3.4.23 printed it in `etcdctl endpoint status -w json` errors.
        let nospace = AlarmMember {
            member_id: 13_668_033_151_171_901_709,
            alarm: AlarmType::Nospace as i32,
        };
        assert_eq!(
            alarm_text(&nospace),
            "memberID:13668033151171901709 alarm:NOSPACE "
        );
        assert_eq!(
            alarm_text(&AlarmMember {
                member_id: 1,
                alarm: AlarmType::Corrupt as i32
            }),
            "memberID:1 alarm:CORRUPT "
        );
        assert_eq!(
            alarm_text(&AlarmMember {
                member_id: 1,
                alarm: 0
            }),
            "memberID:1 "
        );
        assert_eq!(
            alarm_text(&AlarmMember {
                member_id: 0,
                alarm: 7
            }),
            "alarm:7 "
        );
    }
}
