//! The Loco hooks: boot with the migrations, the routes, the recount task,
//! and the test database's truncate and seed.

use std::path::Path;

use async_trait::async_trait;
use counter_core::CounterCache;
use loco_rs::{
    Result,
    app::{AppContext, Hooks, Initializer},
    bgworker::Queue,
    boot::{BootResult, StartMode, create_app},
    config::Config,
    controller::AppRoutes,
    db::{self, truncate_table},
    environment::Environment,
    task::Tasks,
};
use migration::Migrator;

use crate::{
    controllers, initializers,
    models::{_entities, comments},
    tasks,
};

pub struct App;

#[async_trait]
impl Hooks for App {
    fn app_name() -> &'static str {
        env!("CARGO_CRATE_NAME")
    }

    async fn boot(
        mode: StartMode,
        environment: &Environment,
        config: Config,
    ) -> Result<BootResult> {
        create_app::<Self, Migrator>(mode, environment, config).await
    }

    async fn initializers(_ctx: &AppContext) -> Result<Vec<Box<dyn Initializer>>> {
        Ok(vec![Box::new(initializers::counter_tables::CounterTables)])
    }

    fn routes(_ctx: &AppContext) -> AppRoutes {
        AppRoutes::with_default_routes().add_route(controllers::notes::routes())
    }

    async fn connect_workers(_ctx: &AppContext, _queue: &Queue) -> Result<()> {
        Ok(())
    }

    fn register_tasks(tasks: &mut Tasks) {
        tasks.register(tasks::recount::Recount);
    }

    /// `delete_many`, which runs no hooks: the counter table's `cascade`
    /// deletes the counts with the notes, so ids reused by the seed start
    /// at zero.
    async fn truncate(ctx: &AppContext) -> Result<()> {
        truncate_table(&ctx.db, _entities::comments::Entity).await?;
        truncate_table(&ctx.db, _entities::notes::Entity).await?;
        Ok(())
    }

    /// Fixtures go in with `insert_many`, which runs no hooks either: the
    /// recount that follows makes the counter cache exact.
    async fn seed(ctx: &AppContext, base: &Path) -> Result<()> {
        db::seed::<_entities::notes::ActiveModel>(
            &ctx.db,
            &base.join("notes.yaml").display().to_string(),
        )
        .await?;
        db::seed::<_entities::comments::ActiveModel>(
            &ctx.db,
            &base.join("comments.yaml").display().to_string(),
        )
        .await?;
        comments::Entity::recount_counters(&ctx.db).await?;
        Ok(())
    }
}
