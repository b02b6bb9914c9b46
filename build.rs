//! Build script: turns the CRI proto (`proto/runtime/v1/api.proto`) into Rust.
//!
//! Messages come from protobuf-codegen's pure-Rust parser (no `protoc`), in
//! the lite runtime (no reflection tables: smaller binary). The grpcio client
//! and server stubs come from the small generator below, fed by the service
//! descriptors protobuf-parse produces, so that no protobuf 2.x crate is
//! needed. Both outputs land in `OUT_DIR` and are included by `src/cri/api.rs`
//! and `src/cri/grpc.rs`.
//!
//! It also tells `src/version.rs` the target triple and the git commit the
//! binary is built from (`TINYLET_COMMIT` in the environment overrides it,
//! for builds from a tarball), without ever failing the build over git.
//!
//! The CRI code is generated only with the `cri` feature (the default);
//! without it (the fuzz targets' build) only the build facts are set.

use std::env;
#[cfg(feature = "cri")]
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

#[cfg(feature = "cri")]
const PROTO_ROOT: &str = "proto";
#[cfg(feature = "cri")]
const PROTO_FILE: &str = "proto/runtime/v1/api.proto";
/// Generated messages, included by `src/cri/api.rs`.
#[cfg(feature = "cri")]
const API_OUT: &str = "cri_api.rs";
/// Generated grpcio stubs, included by `src/cri/grpc.rs`.
#[cfg(feature = "cri")]
const GRPC_OUT: &str = "cri_grpc.rs";
/// Path from the stubs module to the messages module.
#[cfg(feature = "cri")]
const API_MOD: &str = "super::api";

fn main() -> ExitCode {
    println!("cargo:rerun-if-changed=build.rs");
    describe_build();
    // The CRI code only with the `cri` feature (on by default): the fuzz
    // targets build the library without it.
    #[cfg(feature = "cri")]
    {
        println!("cargo:rerun-if-changed={PROTO_FILE}");
        if let Err(e) = run() {
            eprintln!("error: generating CRI code from {PROTO_FILE}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Sets `TINYLET_TARGET` and `TINYLET_GIT_COMMIT` for `src/version.rs`.
fn describe_build() {
    let target = env::var("TARGET").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=TINYLET_TARGET={target}");
    println!("cargo:rerun-if-env-changed=TINYLET_COMMIT");
    let commit = match env::var("TINYLET_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=TINYLET_GIT_COMMIT={commit}");
}

/// The short hash of HEAD, with `-dirty` when tracked files differ from
/// it; None when git is missing or the crate is not its own checkout (a
/// tarball unpacked somewhere inside another repository).
///
/// Reruns are kept cheap: this script runs again when HEAD moves (HEAD,
/// the branch's ref, packed-refs) and when the sources that make the
/// binary change (then the crate is rebuilt anyway). A change to tests or
/// documents alone does not rebuild the binary, so it does not mark it
/// dirty either.
fn git_commit() -> Option<String> {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?);
    let top = git(&manifest, &["rev-parse", "--show-toplevel"])?;
    if fs::canonicalize(&top).ok()? != fs::canonicalize(&manifest).ok()? {
        return None;
    }
    let mut watched = vec![git(&manifest, &["rev-parse", "--git-path", "HEAD"])?];
    if let Some(branch) = git(&manifest, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(&manifest, &["rev-parse", "--git-path", &branch])?);
    }
    watched.push(git(&manifest, &["rev-parse", "--git-path", "packed-refs"])?);
    for path in watched {
        let path = manifest.join(path);
        // A path that does not exist would make cargo rerun this every time.
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    for source in ["src", "proto", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={source}");
    }
    let hash = git(&manifest, &["rev-parse", "--short=7", "HEAD"])?;
    // --no-optional-locks: do not refresh the index, which would be a
    // change for the next build to notice.
    let changes = git(
        &manifest,
        &[
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        ],
    )?;
    Some(if changes.is_empty() {
        hash
    } else {
        format!("{hash}-dirty")
    })
}

/// Runs git in `dir`; its trimmed output, or None when it cannot run or
/// fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout)
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(feature = "cri")]
fn run() -> Result<(), String> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    generate_messages(&out_dir)?;
    generate_stubs(&out_dir)
}

/// Runs protobuf-codegen into a scratch directory and copies its output to
/// `OUT_DIR/cri_api.rs` without the inner attributes and `//!` lines, which
/// `include!` does not accept; `src/cri/api.rs` sets the lint allowances.
#[cfg(feature = "cri")]
fn generate_messages(out_dir: &Path) -> Result<(), String> {
    let scratch = out_dir.join("protobuf-codegen");
    fs::create_dir_all(&scratch).map_err(|e| format!("creating {}: {e}", scratch.display()))?;
    protobuf_codegen::Codegen::new()
        .pure()
        .include(PROTO_ROOT)
        .input(PROTO_FILE)
        .out_dir(&scratch)
        .customize(
            protobuf_codegen::Customize::default()
                .gen_mod_rs(false)
                .lite_runtime(true),
        )
        .run()
        .map_err(|e| format!("protobuf-codegen: {e:#}"))?;

    let generated = scratch.join("api.rs");
    let text = fs::read_to_string(&generated)
        .map_err(|e| format!("reading {}: {e}", generated.display()))?;
    let mut cleaned = String::with_capacity(text.len());
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#![") || trimmed.starts_with("//!") {
            continue;
        }
        cleaned.push_str(line);
        cleaned.push('\n');
    }
    write_file(&out_dir.join(API_OUT), &cleaned)
}

/// Writes `OUT_DIR/cri_grpc.rs`: per service a method table, a blocking
/// client and a server trait with its `create_*` function.
#[cfg(feature = "cri")]
fn generate_stubs(out_dir: &Path) -> Result<(), String> {
    let parsed = protobuf_parse::Parser::new()
        .pure()
        .include(PROTO_ROOT)
        .input(PROTO_FILE)
        .parse_and_typecheck()
        .map_err(|e| format!("protobuf-parse: {e:#}"))?;

    let mut services = Vec::new();
    for file in &parsed.file_descriptors {
        let package = file.package().to_string();
        for svc in &file.service {
            let mut methods = Vec::new();
            for m in &svc.method {
                if m.client_streaming() || m.server_streaming() {
                    return Err(format!(
                        "{}.{}: streaming RPCs are not supported by this generator",
                        svc.name(),
                        m.name()
                    ));
                }
                methods.push(Rpc {
                    name: m.name().to_string(),
                    input: rust_type(&package, m.input_type())?,
                    output: rust_type(&package, m.output_type())?,
                });
            }
            services.push(Service {
                package: package.clone(),
                name: svc.name().to_string(),
                methods,
            });
        }
    }
    if services.is_empty() {
        return Err("no service found".to_string());
    }

    let mut code = String::new();
    for svc in &services {
        write_service(&mut code, svc).map_err(|e| format!("formatting stubs: {e}"))?;
    }
    write_file(&out_dir.join(GRPC_OUT), &code)
}

#[cfg(feature = "cri")]
struct Service {
    package: String,
    name: String,
    methods: Vec<Rpc>,
}

#[cfg(feature = "cri")]
struct Rpc {
    name: String,
    input: String,
    output: String,
}

/// Maps a fully qualified proto type (`.runtime.v1.VersionRequest`) to its
/// path in the messages module. Only top-level messages of our own package
/// can be RPC arguments here.
#[cfg(feature = "cri")]
fn rust_type(package: &str, proto_type: &str) -> Result<String, String> {
    let prefix = format!(".{package}.");
    match proto_type.strip_prefix(&prefix) {
        Some(name) if !name.contains('.') => Ok(format!("{API_MOD}::{name}")),
        _ => Err(format!(
            "RPC type {proto_type} is not a top-level message of package {package}"
        )),
    }
}

/// `RunPodSandbox` -> `run_pod_sandbox`.
#[cfg(feature = "cri")]
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    let chars: Vec<char> = name.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_uppercase() {
            let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            let prev_upper = i > 0 && chars[i - 1].is_ascii_uppercase();
            if i > 0 && (prev_lower || (prev_upper && next_lower)) {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(feature = "cri")]
fn write_service(w: &mut String, svc: &Service) -> std::fmt::Result {
    let svc_snake = snake_case(&svc.name);
    let svc_upper = svc_snake.to_ascii_uppercase();
    let client = format!("{}Client", svc.name);

    // Method table.
    for m in &svc.methods {
        writeln!(
            w,
            "const METHOD_{svc_upper}_{upper}: ::grpcio::Method<{input}, {output}> = ::grpcio::Method {{\n    \
             ty: ::grpcio::MethodType::Unary,\n    \
             name: \"/{package}.{svc}/{name}\",\n    \
             req_mar: ::grpcio::Marshaller {{ ser: ::grpcio::pb_ser, de: ::grpcio::pb_de }},\n    \
             resp_mar: ::grpcio::Marshaller {{ ser: ::grpcio::pb_ser, de: ::grpcio::pb_de }},\n\
             }};\n",
            upper = snake_case(&m.name).to_ascii_uppercase(),
            input = m.input,
            output = m.output,
            package = svc.package,
            svc = svc.name,
            name = m.name,
        )?;
    }

    // Blocking client. Only the `_opt` form is generated: every call must
    // carry a deadline, since grpcio sets none by default.
    writeln!(
        w,
        "/// Blocking client of `{package}.{svc}`.\n\
         #[derive(Clone)]\n\
         pub struct {client} {{\n    client: ::grpcio::Client,\n}}\n\n\
         impl {client} {{\n    \
         pub fn new(channel: ::grpcio::Channel) -> Self {{\n        \
         {client} {{ client: ::grpcio::Client::new(channel) }}\n    }}\n",
        package = svc.package,
        svc = svc.name,
    )?;
    for m in &svc.methods {
        let snake = snake_case(&m.name);
        writeln!(
            w,
            "    /// Calls `{name}` and waits for the answer.\n    \
             pub fn {snake}_opt(&self, req: &{input}, opt: ::grpcio::CallOption) -> ::grpcio::Result<{output}> {{\n        \
             self.client.unary_call(&METHOD_{svc_upper}_{upper}, req, opt)\n    }}\n",
            name = m.name,
            upper = snake.to_ascii_uppercase(),
            input = m.input,
            output = m.output,
        )?;
    }
    writeln!(w, "}}\n")?;

    // Server trait; methods left out answer UNIMPLEMENTED.
    writeln!(
        w,
        "/// Server side of `{package}.{svc}`; register it with [`create_{svc_snake}`].\n\
         pub trait {svc} {{",
        package = svc.package,
        svc = svc.name,
    )?;
    for m in &svc.methods {
        writeln!(
            w,
            "    fn {snake}(&mut self, ctx: ::grpcio::RpcContext, _req: {input}, sink: ::grpcio::UnarySink<{output}>) {{\n        \
             ::grpcio::unimplemented_call!(ctx, sink)\n    }}",
            snake = snake_case(&m.name),
            input = m.input,
            output = m.output,
        )?;
    }
    writeln!(w, "}}\n")?;

    writeln!(
        w,
        "/// Wraps a [`{svc}`] implementation into a service for `ServerBuilder::register_service`.\n\
         pub fn create_{svc_snake}<S: {svc} + Send + Clone + 'static>(s: S) -> ::grpcio::Service {{\n    \
         let mut builder = ::grpcio::ServiceBuilder::new();",
        svc = svc.name,
    )?;
    for (i, m) in svc.methods.iter().enumerate() {
        let snake = snake_case(&m.name);
        // The last handler takes `s` itself, the others a clone.
        let instance = if i + 1 == svc.methods.len() {
            "s"
        } else {
            "s.clone()"
        };
        writeln!(
            w,
            "    let mut instance = {instance};\n    \
             builder = builder.add_unary_handler(&METHOD_{svc_upper}_{upper}, move |ctx, req, resp| instance.{snake}(ctx, req, resp));",
            upper = snake.to_ascii_uppercase(),
        )?;
    }
    writeln!(w, "    builder.build()\n}}\n")?;
    Ok(())
}

#[cfg(feature = "cri")]
fn write_file(path: &Path, text: &str) -> Result<(), String> {
    // Rewrite only on change so that dependants are not rebuilt needlessly.
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
