//! `cargo loco task recount`: repairs the comments counter cache after
//! writes that bypass the hooks (an import, raw SQL). Exact while the app
//! writes; `dry_run:true` only reports.

use counter_core::CounterCache;
use loco_rs::prelude::*;

use crate::models::comments;

pub struct Recount;

#[async_trait]
impl Task for Recount {
    fn task(&self) -> TaskInfo {
        TaskInfo {
            name: "recount".to_string(),
            detail: "Recount the notes' comment counts from the comment rows".to_string(),
        }
    }

    async fn run(&self, ctx: &AppContext, vars: &task::Vars) -> Result<()> {
        let dry_run = vars.cli_arg("dry_run").is_ok_and(|v| v == "true");
        let differed = if dry_run {
            comments::Entity::check_counters(&ctx.db).await?
        } else {
            comments::Entity::recount_counters(&ctx.db).await?
        };
        println!(
            "recount: {differed} note(s) differed{}",
            if dry_run { " (dry run)" } else { ", repaired" }
        );
        Ok(())
    }
}
