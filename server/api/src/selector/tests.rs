//! The selectors' tests: the original cases, then Kubernetes' own (`labels/selector_test.go`,
//! `meta/v1/helpers_test.go`) and the error messages it gives.

use super::*;
use serde_json::json;
use std::collections::BTreeMap;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn label_selectors_parse_and_match() {
    let s = LabelSelector::parse("app=web,tier!=db,env in (prod, staging),!canary,team")
        .expect("valid");
    assert_eq!(s.requirements.len(), 5);
    assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a")])));
    assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev"), ("team", "a")])));
    assert!(!s.matches(&labels(&[
        ("app", "web"),
        ("env", "prod"),
        ("team", "a"),
        ("canary", "1")
    ])));
    let s = LabelSelector::parse("x notin (a,b)").expect("valid");
    assert!(s.matches(&labels(&[])));
    assert!(!s.matches(&labels(&[("x", "a")])));
    assert!(
        LabelSelector::parse("")
            .expect("empty")
            .matches(&labels(&[]))
    );
}

#[test]
fn bad_label_selectors_are_bad_requests() {
    // `x in ()` was in this list; Kubernetes' `labels.Parse` reads it as `x` in {""}
    // (its documented example `x in (foo,,baz),y,z notin ()`), see
    // `empty_values_parse_as_kubernetes_reads_them`.
    for bad in ["a=b,,c", "x in a", "a=b c", "k=v!"] {
        let e = LabelSelector::parse(bad).expect_err(bad);
        assert_eq!(e.code, 400, "{bad}");
    }
}

#[test]
fn api_label_selectors_convert_and_match() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector as ApiSelector, LabelSelectorRequirement,
    };
    let requirement = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    };
    let api = ApiSelector {
        match_labels: Some([("app".to_string(), "web".to_string())].into()),
        match_expressions: Some(vec![
            requirement("env", "In", &["prod", "staging"]),
            requirement("tier", "NotIn", &["db"]),
            requirement("team", "Exists", &[]),
            requirement("canary", "DoesNotExist", &[]),
        ]),
    };
    let s = LabelSelector::from_api(&api).expect("valid");
    assert_eq!(s.requirements.len(), 5);
    assert!(s.matches(&labels(&[("app", "web"), ("env", "prod"), ("team", "a")])));
    assert!(!s.matches(&labels(&[("app", "web"), ("env", "dev"), ("team", "a")])));
    assert!(!s.matches(&labels(&[
        ("app", "web"),
        ("env", "prod"),
        ("tier", "db"),
        ("team", "a")
    ])));
    assert!(!s.matches(&labels(&[
        ("app", "web"),
        ("env", "prod"),
        ("team", "a"),
        ("canary", "1")
    ])));
    assert!(!s.matches(&labels(&[("env", "prod"), ("team", "a")])));
    // An empty (non-nil) selector selects everything.
    assert!(
        LabelSelector::from_api(&ApiSelector::default())
            .expect("empty")
            .matches(&labels(&[]))
    );
    for bad in [
        requirement("a", "In", &[]),
        requirement("a", "Exists", &["x"]),
        requirement("a", "Equals", &["x"]),
        requirement("bad key", "Exists", &[]),
    ] {
        let api = ApiSelector {
            match_labels: None,
            match_expressions: Some(vec![bad]),
        };
        assert_eq!(
            LabelSelector::from_api(&api).expect_err("invalid").code,
            400
        );
    }
}

#[test]
fn field_selectors_match_supported_fields_only() {
    let pod = json!({"metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "n1", "hostNetwork": true}, "status": {"phase": "Running"}});
    let s = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed", "pods").expect("valid");
    assert!(s.matches(&pod));
    let s = FieldSelector::parse("spec.nodeName=", "pods").expect("valid");
    assert!(!s.matches(&pod));
    assert!(
        FieldSelector::parse("spec.hostNetwork=true", "pods")
            .expect("valid")
            .matches(&pod)
    );
    let e = FieldSelector::parse("spec.nodeName=n1", "configmaps").expect_err("unsupported");
    assert_eq!(e.message, "field label not supported: spec.nodeName");
    assert_eq!(
        FieldSelector::parse("metadata.name=web", "deployments")
            .expect("valid")
            .exact_name(),
        Some("web")
    );
}

fn parse_err(text: &str) -> String {
    LabelSelector::parse(text).expect_err(text).message
}

// Reference: Kubernetes labels/selector_test.go, TestSelectorParse (the strings it must accept
// and refuse) and TestSelectorMatches.
#[test]
fn kubernetes_parse_and_match_cases() {
    for good in [
        "x=a,y=b,z=c",
        "",
        "x!=a,y=b",
        "x=",
        "x= ",
        "x=,z= ",
        "x= ,z= ",
        "!x",
        "x>1",
        "x>1,z<5",
        "\rx",
        "this-is-a-dns.domain.com/key-with-dash",
        "0.1.2.domain/99 notin (10.10.100.1, tick.tack.clock)",
        "foo  in\t (abc)",
        "x notin\n (abc)",
        "x in (abc,)",
        "x notin (abc,def),bar,z in (),w",
    ] {
        assert!(LabelSelector::parse(good).is_ok(), "{good:?}");
    }
    for bad in ["x=a||y=b", "x==a==b", "!x=a", "x<a"] {
        assert_eq!(
            LabelSelector::parse(bad).expect_err(bad).code,
            400,
            "{bad:?}"
        );
    }
    let yes = |selector: &str, pairs: &[(&str, &str)]| {
        LabelSelector::parse(selector)
            .expect(selector)
            .matches(&labels(pairs))
    };
    assert!(yes("", &[("x", "y")]));
    assert!(yes("x=y", &[("x", "y")]));
    assert!(yes("x=y,z=w", &[("x", "y"), ("z", "w")]));
    assert!(yes("x!=y,z!=w", &[("x", "z"), ("z", "a")]));
    // `in` and `notin` where a value stands are values.
    assert!(yes("notin=in", &[("notin", "in")]));
    assert!(yes("x", &[("x", "z")]));
    assert!(yes("!x", &[("y", "z")]));
    assert!(yes("x>1", &[("x", "2")]));
    assert!(yes("x<1", &[("x", "0")]));
    assert!(!yes("x=z", &[]));
    assert!(!yes("x=y", &[("x", "z")]));
    assert!(!yes("x=y,z=w", &[("x", "w"), ("z", "w")]));
    assert!(!yes("x!=y,z!=w", &[("x", "z"), ("z", "w")]));
    assert!(!yes("x", &[("y", "z")]));
    assert!(!yes("!x", &[("x", "z")]));
    assert!(!yes("x>1", &[("x", "0")]));
    assert!(!yes("x<1", &[("x", "2")]));
    // A label that is not an integer satisfies neither Gt nor Lt.
    assert!(!yes("z>1", &[("z", "v2")]));
    assert!(yes(
        "zoo in (mar,lar,dar),moo,thing == map,!thingy",
        &[("zoo", "mar"), ("moo", "lar"), ("thing", "map")]
    ));
}

// Reference: TestSetSelectorParser ("x in ()", "x in (abc,)") and the docs example of
// `labels.Parse`.
#[test]
fn empty_values_parse_as_kubernetes_reads_them() {
    let s = LabelSelector::parse("x in ()").expect("Kubernetes accepts it");
    assert_eq!(
        s.requirements,
        vec![("x".to_string(), LabelOp::In(vec![String::new()]))]
    );
    assert!(s.matches(&labels(&[("x", "")])));
    assert!(!s.matches(&labels(&[("x", "a")])));
    let s = LabelSelector::parse("x in (b,a,,b)").expect("valid");
    // Values are a sorted set, the empty value included.
    assert_eq!(
        s.requirements,
        vec![(
            "x".to_string(),
            LabelOp::In(vec![String::new(), "a".into(), "b".into()])
        )]
    );
    let s = LabelSelector::parse("x in (foo,,baz),y,z notin ()").expect("the docs example");
    assert!(s.matches(&labels(&[("x", "foo"), ("y", "1"), ("z", "q")])));
    assert!(!s.matches(&labels(&[("x", "foo"), ("y", "1"), ("z", "")])));
    // `x=` is x equal to "".
    assert_eq!(
        LabelSelector::parse("x=").expect("valid").requirements,
        vec![("x".to_string(), LabelOp::Equals(String::new()))]
    );
    // `in` after a key is the operator, among values a value.
    let s = LabelSelector::parse("in in (in, notin)").expect("valid");
    assert!(s.matches(&labels(&[("in", "notin")])));
}

// The messages kube-apiserver answers a bad `?labelSelector=` with (`labels.Parse`'s).
#[test]
fn parse_errors_carry_kubernetes_messages() {
    assert_eq!(
        parse_err("a=b,,c"),
        "found ',', expected: identifier after ','"
    );
    assert_eq!(
        parse_err("a=b c"),
        "found 'c', expected: ',' or 'end of string'"
    );
    assert_eq!(
        parse_err("=a"),
        "found '=', expected: !, identifier, or 'end of string'"
    );
    assert_eq!(
        parse_err("x in a"),
        "unable to parse requirement: found 'a' expected: '('"
    );
    assert_eq!(
        parse_err("x in (a b)"),
        "unable to parse requirement: found 'b', expected: ',' or ')'"
    );
    assert_eq!(
        parse_err("x in (a,=)"),
        "unable to parse requirement: found '=', expected: ',', or identifier"
    );
    assert_eq!(
        parse_err("x in (=)"),
        "unable to parse requirement: found '=', expected: ',', ')' or identifier"
    );
    assert_eq!(
        parse_err("x (a)"),
        "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"
    );
    assert_eq!(
        parse_err("x=("),
        "unable to parse requirement: found '(', expected: identifier"
    );
    assert_eq!(
        parse_err("!=x"),
        "found '!=', expected: !, identifier, or 'end of string'"
    );
    assert_eq!(
        parse_err("!,x"),
        "unable to parse requirement: found ',', expected: identifier"
    );
    assert_eq!(
        parse_err("x<a"),
        "unable to parse requirement: values[0]: Invalid value: \"a\": for 'Gt', 'Lt' operators, the value must be an integer"
    );
    // The key is checked at the parser's nil field path.
    assert_eq!(
        parse_err("_x=a"),
        "unable to parse requirement: <nil>: Invalid value: \"_x\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
    );
    assert_eq!(
        parse_err("x=_a"),
        "unable to parse requirement: values[0][x]: Invalid value: \"_a\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    );
    // Two problems with one requirement: aggregated, as `utilerrors.Aggregate` prints them.
    assert_eq!(
        parse_err("x>_1"),
        "unable to parse requirement: [values[0]: Invalid value: \"_1\": for 'Gt', 'Lt' operators, the value must be an integer, values[0][x]: Invalid value: \"_1\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')]"
    );
    // A hostile query string builds no unbounded matcher.
    let many = vec!["k"; SELECTOR_REQUIREMENTS_MAX + 1].join(",");
    assert_eq!(
        parse_err(&many),
        format!("unable to parse requirement: more than {SELECTOR_REQUIREMENTS_MAX} requirements")
    );
    assert!(LabelSelector::parse(&vec!["k"; SELECTOR_REQUIREMENTS_MAX].join(",")).is_ok());
}

fn api(
    match_labels: &[(&str, &str)],
    expressions: &[(&str, &str, Option<&[&str]>)],
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector as ApiSelector, LabelSelectorRequirement,
    };
    ApiSelector {
        match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
        match_expressions: (!expressions.is_empty()).then(|| {
            expressions
                .iter()
                .map(|(key, operator, values)| LabelSelectorRequirement {
                    key: key.to_string(),
                    operator: operator.to_string(),
                    values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
                })
                .collect()
        }),
    }
}

fn from_api_err(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> String {
    LabelSelector::from_api(selector)
        .expect_err("invalid")
        .message
}

// Reference: meta/v1 helpers.go `LabelSelectorAsSelector` and helpers_test.go
// TestLabelSelectorAsSelector: nil selects nothing, `{}` everything, errors as Kubernetes'.
#[test]
fn api_selectors_nil_empty_and_invalid() {
    let nothing = LabelSelector::from_api_opt(None).expect("nil converts");
    assert!(!nothing.is_empty(), "nothing is not everything");
    assert!(!nothing.matches(&labels(&[])));
    assert!(!nothing.matches(&labels(&[("", "")])));
    assert!(!nothing.matches_opt(None));
    let everything = LabelSelector::from_api_opt(Some(&api(&[], &[]))).expect("{} converts");
    assert!(everything.is_empty());
    assert!(everything.matches_opt(None));
    assert_eq!(
        from_api_err(&api(&[], &[("k", "Near", None)])),
        "\"Near\" is not a valid label selector operator"
    );
    assert_eq!(
        from_api_err(&api(&[], &[("k", "In", Some(&[]))])),
        "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty"
    );
    assert_eq!(
        from_api_err(&api(&[], &[("k", "Exists", Some(&["x"]))])),
        "values: Invalid value: []string{\"x\"}: values set must be empty for exists and does not exist"
    );
    assert_eq!(
        from_api_err(&api(&[("k", "a b")], &[])),
        "values[0][k]: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
    );
    assert!(
        from_api_err(&api(&[], &[("a/b/c", "Exists", None)]))
            .starts_with("key: Invalid value: \"a/b/c\": a qualified name must consist of")
    );
    // NotIn without values: an error, not "matches everything" (the controllers' own copy of
    // the matcher read it as the latter).
    assert!(LabelSelector::from_api(&api(&[], &[("k", "NotIn", None)])).is_err());
    // Exists with values: an error, not Exists (the same copy ignored the values).
    assert!(LabelSelector::from_api(&api(&[], &[("k", "Exists", Some(&["v"]))])).is_err());
}

// The cases the controllers' copies tested (`podcontrol::Selector`,
// `deployment::spec::selector_matches`), now against the one implementation.
#[test]
fn controller_selector_cases() {
    let sel = LabelSelector::from_api(&api(
        &[("app", "web")],
        &[
            ("tier", "In", Some(&["a", "b"])),
            ("canary", "DoesNotExist", None),
        ],
    ))
    .expect("valid");
    assert!(sel.matches_opt(Some(&labels(&[("app", "web"), ("tier", "b")]))));
    assert!(!sel.matches_opt(Some(&labels(&[("app", "web"), ("tier", "c")]))));
    assert!(!sel.matches_opt(Some(&labels(&[
        ("app", "web"),
        ("tier", "a"),
        ("canary", "1")
    ]))));
    assert!(!sel.matches_opt(None));
    let sel = LabelSelector::from_api(&api(&[("app", "web")], &[("tier", "NotIn", Some(&["db"]))]))
        .expect("valid");
    assert!(sel.matches(&labels(&[("app", "web")])));
    assert!(sel.matches(&labels(&[("app", "web"), ("tier", "fe")])));
    assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "db")])));
    assert!(!sel.matches(&labels(&[("app", "api")])));
}

// Reference: TestSetMatches (`SelectorFromSet`): a subset relation, empty matches all.
#[test]
fn set_selectors() {
    let node = labels(&[("foo", "bar"), ("baz", "blah")]);
    for (set, expected) in [
        (labels(&[]), true),
        (labels(&[("foo", "bar")]), true),
        (labels(&[("foo", "bar"), ("baz", "blah")]), true),
        (labels(&[("foo", "blah")]), false),
        (labels(&[("foo", "bar"), ("foobar", "bar")]), false),
    ] {
        assert_eq!(set_matches(&set, Some(&node)), expected, "{set:?}");
        assert_eq!(
            LabelSelector::from_set(&set).matches(&node),
            expected,
            "{set:?}"
        );
    }
    assert!(set_matches(&labels(&[]), None));
    assert!(!set_matches(&labels(&[("foo", "bar")]), None));
}

// Reference: TestRequirementConstructor.
#[test]
fn requirement_constructor() {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases: [(&str, Operator, Option<Vec<String>>, bool); 13] = [
        ("x", Operator::In, None, false),
        ("x", Operator::NotIn, Some(vec![]), false),
        ("x", Operator::In, Some(strings(&["foo"])), true),
        ("x", Operator::NotIn, Some(strings(&["foo"])), true),
        ("x", Operator::Exists, None, true),
        ("x", Operator::DoesNotExist, None, true),
        ("1foo", Operator::In, Some(strings(&["bar"])), true),
        ("1234", Operator::In, Some(strings(&["bar"])), true),
        ("y", Operator::GreaterThan, Some(strings(&["1"])), true),
        ("z", Operator::LessThan, Some(strings(&["6"])), true),
        ("foo", Operator::GreaterThan, Some(strings(&["bar"])), false),
        ("barz", Operator::LessThan, Some(strings(&["blah"])), false),
        // Breaks the DNS rule that a key is at most 253 characters.
        (&"a".repeat(254), Operator::Exists, None, false),
    ];
    for (key, operator, values, ok) in cases {
        assert_eq!(
            new_requirement(key, operator, values.as_deref(), None).is_ok(),
            ok,
            "{key} {operator:?} {values:?}"
        );
    }
    assert_eq!(
        new_requirement("k", Operator::Equals, Some(&strings(&["a", "b"])), Some("root[0]")),
        Err("root[0].values: Invalid value: []string{\"a\", \"b\"}: exact-match compatibility requires one single value".to_string())
    );
}
