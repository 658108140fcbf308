//! `clients add|rotate|revoke|list|import`: the Redis client registry
//! (`PROXY_POOL_CLIENT_REGISTRY=redis`). Secrets are printed once, when made,
//! and only their digests are stored.

use std::io::Read;

use proxy_pool::pool::PutMode;
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{ClientEntry, RedisRegistry};

use crate::cli::{CliResult, operator_pool};
use crate::cli::{
    ClientAddArgs, ClientIdArgs, ClientImportArgs, ClientListArgs, ClientRotateArgs,
    ClientsCommand, PoolArgs,
};
use crate::credentials::new_secret;
use crate::output::{say, table};

/// Runs one `clients` command.
pub async fn run(command: ClientsCommand) -> CliResult {
    match command {
        ClientsCommand::Add(args) => add(args).await,
        ClientsCommand::Rotate(args) => rotate(args).await,
        ClientsCommand::Revoke(args) => revoke(args).await,
        ClientsCommand::List(args) => list(args).await,
        ClientsCommand::Import(args) => import(args).await,
    }
}

fn registry(args: &PoolArgs) -> Result<RedisRegistry, Box<dyn std::error::Error>> {
    let (_, pool) = operator_pool(args)?;
    Ok(RedisRegistry::new(pool))
}

/// `clients add`.
async fn add(args: ClientAddArgs) -> CliResult {
    let registry = registry(&args.target.pool)?;
    let secret = new_secret()?;
    let entry = ClientEntry {
        id: args.target.id,
        api_keys: vec![CredentialHash::of(secret.as_bytes()).encode()],
        bearer_tokens: Vec::new(),
        basic: Vec::new(),
        allowed_upstreams: args.upstreams,
        allowed_sources: args.sources,
        rate_limit: args.rate,
        max_count: args.max_count,
    };
    registry
        .store(PutMode::Add, std::slice::from_ref(&entry))
        .await?;
    say!("added client {}", entry.id);
    say!("api key (shown once): {secret}");
    Ok(())
}

/// `clients rotate`.
async fn rotate(args: ClientRotateArgs) -> CliResult {
    let registry = registry(&args.target.pool)?;
    let id = args.target.id;
    let mut entry = registry
        .entry(&id)
        .await?
        .ok_or_else(|| format!("client {id} is not registered"))?;
    let secret = new_secret()?;
    let retired = if args.keep_old {
        0
    } else {
        std::mem::take(&mut entry.api_keys).len()
    };
    entry
        .api_keys
        .push(CredentialHash::of(secret.as_bytes()).encode());
    registry.store(PutMode::Replace, &[entry]).await?;
    say!("rotated client {id}: {retired} old API key(s) retired");
    say!("api key (shown once): {secret}");
    Ok(())
}

/// `clients revoke`.
async fn revoke(args: ClientIdArgs) -> CliResult {
    let registry = registry(&args.pool)?;
    match registry.revoke(&args.id).await? {
        Some(n) => {
            say!("revoked client {}: {n} credential(s) removed", args.id);
            Ok(())
        }
        None => Err(format!("client {} is not registered", args.id).into()),
    }
}

/// `clients list`.
async fn list(args: ClientListArgs) -> CliResult {
    let entries = registry(&args.pool)?.list().await?;
    if args.json {
        say!("{:#}", serde_json::json!({ "clients": entries }));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            vec![
                e.id.clone(),
                e.allowed_upstreams
                    .as_ref()
                    .map_or_else(|| "*".to_owned(), |u| u.join(",")),
                if e.allowed_sources.is_empty() {
                    "*".to_owned()
                } else {
                    e.allowed_sources.join(",")
                },
                e.rate_limit.clone().unwrap_or_else(|| "default".to_owned()),
                e.api_keys.len().to_string(),
                (e.bearer_tokens.len() + e.basic.len()).to_string(),
                e.max_count
                    .map_or_else(|| "-".to_owned(), |m| m.to_string()),
            ]
        })
        .collect();
    table(
        &[
            "id",
            "upstreams",
            "sources",
            "rate",
            "api keys",
            "other creds",
            "max count",
        ],
        &rows,
        4,
    )?;
    say!("{} client(s)", entries.len());
    Ok(())
}

/// `clients import`.
async fn import(args: ClientImportArgs) -> CliResult {
    let registry = registry(&args.pool)?;
    let mut document = String::new();
    if args.file.as_os_str() == "-" {
        std::io::stdin().read_to_string(&mut document)?;
    } else {
        document = std::fs::read_to_string(&args.file)
            .map_err(|e| format!("{}: {e}", args.file.display()))?;
    }
    let done = registry.import(&document).await?;
    say!(
        "imported {} client(s): {} added, {} replaced",
        done.added + done.replaced,
        done.added,
        done.replaced
    );
    Ok(())
}
