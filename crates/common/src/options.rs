//! The one command-line parser of the server, the examples and the benchmarks: options are `--name value` pairs, each taken out by name, and whatever is left
//! when all are taken is an error, so that a misspelled option stops the program instead of
//! leaving it to run on a default.

use std::fmt::Display;
use std::str::FromStr;

/// Command-line options as `--name value` pairs; what is left over is an error. An option given
/// more than once takes its last value (`make bench BENCH_ARGS="--out DIR"` overrides the
/// Makefile's own `--out`). With `--help` (or `-h`) every option reads as not given, and
/// [`Options::finish`] lists the options the program took and exits.
pub struct Options {
    args: Vec<String>,
    help: bool,
    /// The names taken so far, in order: what `--help` lists.
    names: Vec<String>,
}

impl Options {
    /// The program's arguments, less `cargo bench`'s `--bench` (see [`Options::from_args`]).
    pub fn from_env() -> Self {
        Self::from_args(std::env::args().skip(1))
    }

    /// `args`, less any bare `--bench`: `cargo bench` adds one to every benchmark's arguments
    /// (it tells libtest's harness to benchmark), and ours, with `harness = false`, have no use
    /// for it.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Self {
        let mut args: Vec<String> = args.into_iter().filter(|arg| arg != "--bench").collect();
        let before = args.len();
        args.retain(|arg| arg != "--help" && arg != "-h");
        Self {
            help: args.len() != before,
            args,
            names: Vec::new(),
        }
    }

    /// Takes `--name value` out of the options (every time it is given; the last value counts).
    pub fn take(&mut self, name: &str) -> Result<Option<String>, String> {
        if !self.names.iter().any(|known| known == name) {
            self.names.push(name.to_owned());
        }
        let mut value = None;
        while let Some(at) = self.args.iter().position(|arg| arg == name) {
            if at + 1 >= self.args.len() {
                return Err(format!("{name} needs a value"));
            }
            value = Some(self.args.remove(at + 1));
            self.args.remove(at);
        }
        Ok(value.filter(|_| !self.help))
    }

    /// Takes `--name value` out of the options; an error if it is not there (but for `--help`).
    pub fn take_required(&mut self, name: &str) -> Result<String, String> {
        let help = self.help;
        self.take(name)?
            .or_else(|| help.then(String::new))
            .ok_or_else(|| format!("{name} is required"))
    }

    /// Takes `--name value` out of the options, read as a `T`, if it is there.
    pub fn take_optional<T: FromStr<Err: Display>>(&mut self, name: &str) -> Result<Option<T>, String> {
        self.take(name)?.map(|text| parse(name, &text)).transpose()
    }

    pub fn take_parsed<T: FromStr<Err: Display>>(&mut self, name: &str, default: T) -> Result<T, String> {
        Ok(self.take_optional(name)?.unwrap_or(default))
    }

    /// Takes `--name a,b,c` out of the options, each item read as a `T` (e.g. counts:
    /// `--chunks 1,2,4,8`).
    pub fn take_list<T: FromStr<Err: Display> + Clone>(
        &mut self,
        name: &str,
        default: &[T],
    ) -> Result<Vec<T>, String> {
        match self.take(name)? {
            Some(text) => text.split(',').map(|item| parse(name, item)).collect(),
            None => Ok(default.to_vec()),
        }
    }

    /// Whether `--help` or `-h` was given, for a program with a usage text of its own (which
    /// then lists no options at [`Options::finish`]).
    pub fn take_help(&mut self) -> bool {
        std::mem::take(&mut self.help)
    }

    /// Fails on anything not taken. With `--help`, lists the options taken and exits instead.
    pub fn finish(self) -> Result<(), String> {
        if self.help {
            let program = std::env::args().next().unwrap_or_default();
            println!(
                "usage: {program} [OPTION VALUE]...\noptions: {}\n(each is described at the top of the \
                 program's source, and its default is used where it is not given)",
                self.names.join(", ")
            );
            std::process::exit(0);
        }
        match self.args.first() {
            Some(arg) => Err(format!("unknown argument {arg:?}")),
            None => Ok(()),
        }
    }
}

/// `text`, the value of option `name`, read as a `T`.
fn parse<T: FromStr<Err: Display>>(name: &str, text: &str) -> Result<T, String> {
    text.parse()
        .map_err(|err| format!("{name}: cannot read {text:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::Options;

    fn given(args: &[&str]) -> Options {
        Options::from_args(args.iter().map(|arg| arg.to_string()))
    }

    #[test]
    fn takes_options_by_name_and_the_last_of_a_repeated_one() {
        let mut options = given(&["--rows", "3", "--out", "a", "--bench", "--out", "b"]);
        assert_eq!(options.take("--out"), Ok(Some("b".into())));
        assert_eq!(options.take_parsed("--rows", 1), Ok(3));
        assert_eq!(options.take_parsed("--frames", 40), Ok(40));
        assert_eq!(options.take("--device"), Ok(None));
        assert_eq!(options.finish(), Ok(()), "cargo bench's bare --bench is dropped");
    }

    #[test]
    fn an_unknown_or_misspelled_option_is_an_error() {
        let mut options = given(&["--rowz", "3", "--frames", "4"]);
        assert_eq!(options.take_parsed("--rows", 1), Ok(1));
        assert_eq!(options.take_parsed("--frames", 40), Ok(4));
        assert_eq!(options.finish(), Err("unknown argument \"--rowz\"".into()));
        assert_eq!(
            given(&["stray"]).finish(),
            Err("unknown argument \"stray\"".into())
        );
    }

    #[test]
    fn a_missing_or_unreadable_value_is_an_error() {
        assert_eq!(given(&["--out"]).take("--out"), Err("--out needs a value".into()));
        assert_eq!(
            given(&[]).take_required("--model"),
            Err("--model is required".into())
        );
        assert_eq!(
            given(&["--frames", "many"]).take_parsed("--frames", 40),
            Err("--frames: cannot read \"many\": invalid digit found in string".into())
        );
        assert_eq!(
            given(&["--seconds", "1.5"]).take_optional::<f64>("--seconds"),
            Ok(Some(1.5))
        );
    }

    #[test]
    fn help_reads_every_option_as_not_given() {
        let mut options = given(&["--frames", "4", "--help"]);
        assert_eq!(options.take_parsed("--frames", 40), Ok(40));
        assert_eq!(options.take_required("--model"), Ok(String::new()));
        assert_eq!(options.names, ["--frames", "--model"]);
        assert!(options.take_help(), "a program with a usage of its own");
        assert_eq!(options.finish(), Ok(()));
    }

    #[test]
    fn lists_are_comma_separated() {
        let mut options = given(&["--chunks", "1,4"]);
        assert_eq!(options.take_list("--chunks", &[1, 2, 4, 8]), Ok(vec![1, 4]));
        assert_eq!(options.take_list("--live", &[1, 2, 3, 4]), Ok(vec![1, 2, 3, 4]));
        assert_eq!(
            given(&["--chunks", "1,,4"]).take_list::<usize>("--chunks", &[1]),
            Err("--chunks: cannot read \"\": cannot parse integer from empty string".into())
        );
    }
}
