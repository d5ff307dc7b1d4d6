//! `sea-orm-cli`, exactly as the crate's own binary runs it: CI
//! regenerates the Loco example's entities with it.

#[tokio::main]
async fn main() {
    sea_orm_cli::main().await;
}
