//! Places the buffers of MiniMalloc CSV files or traces and prints what each reached:
//! `cargo run --release --example place_csv -- [--capacity N] [--time-limit S] FILE...`
//!
//! A file whose name ends in `.jsonl` or `.jsonl.gz` is a trace, placed as
//! `cubepool.place(trace)` places it (allocation `i` is buffer `i`, by event index).
//! Each line gives the height, the floor (peak live bytes), the height over the floor,
//! the wall time and the process's CPU time for the file (they differ on a loaded
//! machine). `--dump DIR` also writes each trace's buffers as MiniMalloc CSV there.
use std::time::Duration;

use cubepool::placement::csv::read_csv;
use cubepool::placement::{place, PlaceOptions, Problem};
use cubepool::trace::Trace;

/// CPU seconds this process has used (user + system), from `/proc/self/stat`; `None`
/// where that is not readable.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn load(file: &str) -> Result<Problem, String> {
    if file.ends_with(".jsonl") || file.ends_with(".jsonl.gz") {
        let trace = Trace::load(file).map_err(|e| e.to_string())?;
        return Problem::from_trace(&trace).map_err(|e| e.to_string());
    }
    let data = std::fs::read(file).map_err(|e| e.to_string())?;
    let csv = read_csv(&data).map_err(|e| e.to_string())?;
    Problem::new(csv.buffers).map_err(|e| e.to_string())
}

fn main() {
    let mut options = PlaceOptions::default();
    let mut files = Vec::new();
    let mut dump: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--capacity" => options.capacity = args.next().and_then(|v| v.parse().ok()),
            "--time-limit" => {
                let secs: f64 = args.next().and_then(|v| v.parse().ok()).unwrap_or(10.0);
                options.time_limit = Duration::from_secs_f64(secs);
            }
            "--dump" => dump = args.next(),
            _ => files.push(arg),
        }
    }
    for file in files {
        let problem = match load(&file) {
            Ok(problem) => problem,
            Err(error) => {
                println!("{file}: {error}");
                continue;
            }
        };
        if let Some(dir) = &dump {
            let name = std::path::Path::new(&file)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let mut text = String::from("id,lower,upper,size\n");
            for (i, b) in problem.buffers().iter().enumerate() {
                text.push_str(&format!("{i},{},{},{}\n", b.lower, b.upper, b.size));
            }
            let out = format!("{dir}/{}.csv", name.split('.').next().unwrap_or("trace"));
            if let Err(error) = std::fs::write(&out, text) {
                eprintln!("{out}: {error}");
            }
        }
        let cpu = cpu_seconds();
        match place(&problem, &options) {
            Ok(p) => println!(
                "{file}: {} buffers, height {} lower bound {} ({:+.2} % over) optimal {} by {} \
                 in {:.3} s wall, {} CPU",
                problem.len(),
                p.height,
                p.lower_bound,
                100.0 * (p.height as f64 / p.lower_bound.max(1) as f64 - 1.0),
                p.optimal,
                p.method.as_str(),
                p.elapsed.as_secs_f64(),
                match (cpu, cpu_seconds()) {
                    (Some(a), Some(b)) => format!("{:.2} s", b - a),
                    _ => "?".to_string(),
                }
            ),
            Err(error) => println!("{file}: {error}"),
        }
    }
}
