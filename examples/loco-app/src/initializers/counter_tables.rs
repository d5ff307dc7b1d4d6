//! `cargo loco doctor` compares the counter tables in the database with
//! their declaration (`migration::counters`): a declaration changed
//! without its migration (`cascade` turned on, a key made windowed) or a
//! table made some other way is reported with the migration to run.

use async_trait::async_trait;
use loco_rs::{
    Result,
    app::{AppContext, Initializer},
    doctor::{Check, CheckStatus},
};

use counter_core::SlottedCounter;

use crate::models::notes;

pub struct CounterTables;

#[async_trait]
impl Initializer for CounterTables {
    fn name(&self) -> String {
        "counter-tables".to_owned()
    }

    async fn check(&self, ctx: &AppContext) -> Result<Option<Check>> {
        let drifts = notes::Entity::counters().check_table(&ctx.db).await?;
        let check = if drifts.is_empty() {
            Check {
                status: CheckStatus::Ok,
                message: "counter tables match their declaration".to_owned(),
                description: None,
            }
        } else {
            let found: Vec<String> = drifts.iter().map(ToString::to_string).collect();
            Check {
                status: CheckStatus::NotOk,
                message: "counter tables differ from their declaration".to_owned(),
                description: Some(found.join("\n")),
            }
        };
        Ok(Some(check))
    }
}
