//! A copy of the catalog as of one instant, for a snapshot.
//!
//! **Invariant:** every table is read in one read transaction (one instant), and the
//! copy becomes `catalog.redb` only once its commit is durable (built under a temporary
//! name and renamed, as a new catalog is at open).

use super::*;

/// What `Catalog::copy_to` wrote.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatalogCopy {
    /// The topics the copy names, in order.
    pub topics: Vec<String>,
    /// Rows of the groups table: every group with durable state.
    pub groups: usize,
    /// The new catalog file's size.
    pub bytes: u64,
}

impl Catalog {
    /// Writes every table as it is now (one read transaction) into a new catalog at
    /// `dest`, which must not exist; its directory is synced. The copy says what the
    /// source's says of the last stop: while the instance runs, not clean, so the copy's
    /// first open recovers as after a crash at this instant.
    pub fn copy_to(&self, fs: &Fs, dest: &Path) -> Result<CatalogCopy> {
        let from = self.db.begin_read().map_err(|e| cat_err("reading", e))?;
        let tmp = dest.with_extension("redb.new");
        fs.remove_file(&tmp)?;
        let mut copy = CatalogCopy::default();
        {
            let db = open_db(fs, &tmp)?;
            init(&db, &tmp)?;
            let to = db.begin_write().map_err(|e| cat_err("copying", e))?;
            copy_table(&from, &to, META)?;
            copy_table(&from, &to, TOPICS)?;
            copy.groups = copy_table(&from, &to, GROUPS)?;
            copy_table(&from, &to, ATTEMPTS)?;
            copy_table(&from, &to, DEAD_LETTER_INTENTS)?;
            copy_table(&from, &to, TOPIC_STARTS)?;
            copy_table(&from, &to, TOPIC_CONFIGS)?;
            to.commit().map_err(|e| cat_err("copying", e))?;
            let topics = from.open_table(TOPICS).map_err(|e| cat_err("reading", e))?;
            for row in topics.iter().map_err(|e| cat_err("reading", e))? {
                let (k, _) = row.map_err(|e| cat_err("reading", e))?;
                copy.topics.push(k.value().to_owned());
            }
        }
        fs.rename(&tmp, dest)?;
        if let Some(dir) = dest.parent() {
            fs.sync_dir(dir)?;
        }
        copy.bytes = fs.file_stat(dest)?.len;
        Ok(copy)
    }
}

/// Copies every row of `table`; returns how many.
fn copy_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    from: &redb::ReadTransaction,
    to: &redb::WriteTransaction,
    table: TableDefinition<K, V>,
) -> Result<usize> {
    let src = from.open_table(table).map_err(|e| cat_err("reading", e))?;
    let mut dst = to.open_table(table).map_err(|e| cat_err("copying", e))?;
    let mut rows = 0;
    for row in src.iter().map_err(|e| cat_err("reading", e))? {
        let (k, v) = row.map_err(|e| cat_err("reading", e))?;
        dst.insert(k.value(), v.value())
            .map_err(|e| cat_err("copying", e))?;
        rows += 1;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy holds every row the source held at the copy, and none committed after.
    #[test]
    fn a_copy_holds_every_table_as_of_one_instant() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let fs = Fs::real();
        let c = Catalog::open(&fs, &tmp.path().join("catalog.redb")).expect("open");
        let group = GroupRecord {
            cursor: 3,
            dead_lettered: 1,
            ..GroupRecord::default()
        };
        let attempt = AttemptRecord {
            attempts: 2,
            last_reason: "boom".into(),
            not_before_ms: 1_234,
        };
        let config = TopicConfigRecord {
            retention_bytes: Some(9),
            ..TopicConfigRecord::default()
        };
        c.commit(&[
            Op::PutTopic("t".into(), TopicRecord { created_ms: 5 }),
            Op::PutGroup("t".into(), "g".into(), group.clone(), 1),
            Op::PutAttempt("t".into(), "g".into(), 3, attempt.clone()),
            Op::PutIntent("t".into(), "g".into(), 4, DeadLetterIntent::default()),
            Op::SetTopicStart("t".into(), 2),
            Op::PutTopicConfig("t".into(), config.clone()),
            Op::SetClean(false),
        ])
        .expect("commit");
        let dest = tmp.path().join("copy.redb");
        let copy = c.copy_to(&fs, &dest).expect("copy");
        c.commit(&[Op::PutTopic("later".into(), TopicRecord::default())])
            .expect("commit");
        assert_eq!((copy.topics, copy.groups), (vec!["t".to_owned()], 1));
        assert!(copy.bytes > 0);
        drop(c);
        let d = Catalog::open(&fs, &dest).expect("open copy");
        assert_eq!(d.topics().expect("topics").len(), 1);
        assert_eq!(
            d.groups().expect("groups")[&("t".into(), "g".into())],
            group
        );
        assert_eq!(d.attempts("t", "g").expect("attempts")[&3], attempt);
        assert!(d.intent("t", "g", 4).expect("intent").is_some());
        assert_eq!(d.topic_starts().expect("starts")["t"], 2);
        assert_eq!(d.topic_configs().expect("configs")["t"], config);
        assert!(!d.was_clean().expect("clean"), "as the source said");
    }
}
