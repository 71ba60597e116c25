use serde_json::Value;

use super::*;
use crate::protobuf::{message, message_for, transcode};

const RECORDED: &str = include_str!("../../../../../tests/fixtures/real-apiserver-v1.36.json");

fn message_of(kind: &str, api_version: &str) -> Option<&'static Message> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    message_for(group, version, kind)
        .or_else(|| message(&format!("k8s.io.apimachinery.pkg.apis.meta.v1.{kind}")))
}

/// A recorded object: its message, the `kind` and `apiVersion` it was sent
/// with (none for a list item), its JSON.
type Recorded = (&'static Message, Option<(String, String)>, String);

/// Every object the recorded kube-apiserver v1.36.2 sent in JSON, as it
/// sent it (keys in its order; the recording keeps them), with the
/// `TypeMeta` it carried: objects alone with theirs, list items without.
fn recorded() -> Vec<Recorded> {
    let recorded: Value = serde_json::from_str(RECORDED).unwrap();
    let mut out = Vec::new();
    for case in recorded["cases"].as_array().unwrap() {
        let body = &case["response"]["body"];
        let (Some(kind), Some(api_version)) = (body["kind"].as_str(), body["apiVersion"].as_str())
        else {
            continue;
        };
        if let Some(m) = message_of(kind, api_version)
            && !kind.ends_with("List")
            && kind != "Status"
        {
            out.push((
                m,
                Some((kind.to_string(), api_version.to_string())),
                body.to_string(),
            ));
        }
        if let (Some(item_kind), Some(items)) =
            (kind.strip_suffix("List"), body["items"].as_array())
            && let Some(m) = message_of(item_kind, api_version)
        {
            out.extend(items.iter().map(|i| (m, None, i.to_string())));
        }
    }
    out
}

fn round_trip(
    m: &'static Message,
    type_meta: Option<(&str, &str)>,
    json: &str,
) -> std::result::Result<String, String> {
    let mut pb = Vec::new();
    transcode(json.as_bytes(), m, &mut pb).map_err(|e| format!("to protobuf: {e}"))?;
    let mut back = Vec::new();
    to_json(&pb, m, type_meta, &mut back).map_err(|e| format!("to JSON: {e}"))?;
    String::from_utf8(back).map_err(|e| e.to_string())
}

#[test]
fn the_recorded_objects_come_back_as_the_apiserver_wrote_them() {
    let corpus = recorded();
    assert!(corpus.len() > 20, "{}", corpus.len());
    for (m, tm, json) in &corpus {
        let tm = tm.as_ref().map(|(k, v)| (k.as_str(), v.as_str()));
        let back = round_trip(m, tm, json).unwrap_or_else(|e| panic!("{}: {e}: {json}", m.name));
        assert_eq!(&back, json, "{}", m.name);
    }
}

#[test]
fn go_strings() {
    let cases: &[(&[u8], &str)] = &[
        (b"plain", r#""plain""#),
        (b"q\"b\\", r#""q\"b\\""#),
        (b"<a&b>", r#""\u003ca\u0026b\u003e""#),
        (b"\n\r\t\x08\x0c\x01\x1f\x7f", r#""\n\r\t\b\f\u0001\u001f""#),
        ("é☃😀".as_bytes(), "\"é☃😀\""),
        ("a\u{2028}b\u{2029}".as_bytes(), r#""a\u2028b\u2029""#),
        (b"\xff\xc3(", r#""\ufffd\ufffd(""#),
        (b"\xed\xa0\x80", r#""\ufffd\ufffd\ufffd""#),
    ];
    for (input, want) in cases {
        let mut out = Vec::new();
        string(&mut out, input);
        let want = want.replace("\u{7f}", "");
        let got = String::from_utf8_lossy(&out).replace('\u{7f}', "");
        assert_eq!(got, want, "{input:?}");
    }
    // DEL is written as it is.
    let mut out = Vec::new();
    string(&mut out, b"\x7f");
    assert_eq!(out, b"\"\x7f\"");
}

#[test]
fn go_durations() {
    for (nanos, want) in [
        (0, "0s"),
        (1, "1ns"),
        (1_100, "1.1\u{b5}s"),
        (2_200_000, "2.2ms"),
        (3_300_000_000, "3.3s"),
        (4 * 60 * 1_000_000_000 + 5_000_000_000, "4m5s"),
        (
            5 * 3_600 * 1_000_000_000 + 6 * 60 * 1_000_000_000 + 7_001_000_000,
            "5h6m7.001s",
        ),
        (3_600 * 1_000_000_000, "1h0m0s"),
        (-1_500_000_000, "-1.5s"),
        (i64::MIN, "-2562047h47m16.854775808s"),
    ] {
        let mut out = Vec::new();
        go_duration(&mut out, nanos);
        assert_eq!(String::from_utf8(out).unwrap(), want, "{nanos}");
    }
}

#[test]
fn go_floats() {
    for (f, want) in [
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (0.1, "0.1"),
        (1.5e20, "150000000000000000000"),
        (1e21, "1e+21"),
        (1.25e22, "1.25e+22"),
        (1e-6, "0.000001"),
        (1.5e-7, "1.5e-7"),
        (-2.5e-10, "-2.5e-10"),
        (123456.789, "123456.789"),
    ] {
        let mut out = Vec::new();
        float(&mut out, f).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), want, "{f}");
    }
    assert!(float(&mut Vec::new(), f64::NAN).is_err());
}

#[test]
fn times_as_go_formats_them() {
    for seconds in [
        0i64,
        1,
        951_782_400,   // 2000-02-29
        1_735_689_599, // 2024-12-31T23:59:59
        -1,
        -62_135_596_799,
        253_402_207_200, // 9999-12-30T22:00:00, jiff's last
    ] {
        let want = jiff::Timestamp::from_second(seconds)
            .unwrap()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        let mut out = Vec::new();
        rfc3339(&mut out, seconds, None).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), format!("\"{want}\""));
    }
    let mut out = Vec::new();
    rfc3339(&mut out, 1_735_689_599, Some(123_456_789)).unwrap();
    assert_eq!(out, b"\"2024-12-31T23:59:59.123456Z\"");
    assert!(rfc3339(&mut Vec::new(), 253_402_300_800, None).is_err());
    assert!(rfc3339(&mut Vec::new(), -62_167_219_201, None).is_err());
}

#[test]
fn raw_json_compacted_as_go_does() {
    let mut out = Vec::new();
    compact(
        &mut out,
        b" { \"f:a\" : { \"<x>\" : [ 1 , \"a\\\" b&\" ] } , \"u\":\"\xe2\x80\xa8\" } ",
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"f:a":{"\u003cx\u003e":[1,"a\" b\u0026"]},"u":"\u2028"}"#
    );
    assert!(compact(&mut Vec::new(), b"{").is_err());
    assert!(compact(&mut Vec::new(), b"").is_err());
}

/// A ConfigMap's message with one field appended.
fn config_map_with(extra: &[u8]) -> Vec<u8> {
    let cm = message("k8s.io.api.core.v1.ConfigMap").unwrap();
    let mut pb = Vec::new();
    transcode(br#"{"metadata":{"name":"a"}}"#, cm, &mut pb).unwrap();
    pb.extend_from_slice(extra);
    pb
}

#[test]
fn what_it_cannot_write_exactly_is_refused() {
    let cm = message("k8s.io.api.core.v1.ConfigMap").unwrap();
    let mut out = Vec::new();
    assert_eq!(to_json(&config_map_with(&[]), cm, None, &mut out), Ok(()));
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"metadata":{"name":"a"}}"#
    );
    // A field number a newer apiserver might write.
    assert!(
        to_json(
            &config_map_with(b"\xfa\x06\x01x"),
            cm,
            None,
            &mut Vec::new()
        )
        .is_err()
    );
    // `immutable` (4, a varint) as bytes.
    assert!(to_json(&config_map_with(b"\x22\x01x"), cm, None, &mut Vec::new()).is_err());
    // `metadata` twice.
    assert!(to_json(&config_map_with(b"\x0a\x00"), cm, None, &mut Vec::new()).is_err());
    // A truncated field.
    assert!(to_json(&config_map_with(b"\x12\x05ab"), cm, None, &mut Vec::new()).is_err());
    // The same data key twice.
    let twice = b"\x12\x06\x0a\x01k\x12\x01v\x12\x06\x0a\x01k\x12\x01w";
    assert!(to_json(&config_map_with(twice), cm, None, &mut Vec::new()).is_err());
}

#[test]
fn empty_and_unset_as_the_go_struct_holds_them() {
    let cm = message("k8s.io.api.core.v1.ConfigMap").unwrap();
    // Data keys sorted, `[]byte` values in base64 (an empty one `""`, an
    // absent one `null`), `immutable` set to false written (a pointer).
    let json = br#"{"metadata":{"name":"a","labels":{},"finalizers":[]},"immutable":false,"data":{"b":"2","a":""},"binaryData":{"x":"","y":null,"z":"aGk="}}"#;
    let mut pb = Vec::new();
    transcode(json, cm, &mut pb).unwrap();
    let mut out = Vec::new();
    to_json(&pb, cm, Some(("ConfigMap", "v1")), &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"},"immutable":false,"data":{"a":"","b":"2"},"binaryData":{"x":"","y":null,"z":"aGk="}}"#
    );
    // An EndpointSlice's endpoints, not omitempty: nil when none.
    let slice = message("k8s.io.api.discovery.v1.EndpointSlice").unwrap();
    let mut pb = Vec::new();
    transcode(
        br#"{"metadata":{"name":"s"},"addressType":"IPv4","endpoints":[]}"#,
        slice,
        &mut pb,
    )
    .unwrap();
    let mut out = Vec::new();
    to_json(&pb, slice, None, &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        r#"{"metadata":{"name":"s"},"addressType":"IPv4","endpoints":null,"ports":null}"#
    );
}

#[test]
fn a_pod_with_every_special_type() {
    let pod = message("k8s.io.api.core.v1.Pod").unwrap();
    let json = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","uid":"u","resourceVersion":"5","creationTimestamp":"2024-01-02T03:04:05Z","labels":{"a":"b"},"managedFields":[{"manager":"m","operation":"Update","apiVersion":"v1","time":"2024-01-02T03:04:05Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:a":{}}}}}]},"spec":{"volumes":[{"name":"v","configMap":{"name":"c","defaultMode":420}}],"containers":[{"name":"c","image":"i","ports":[{"containerPort":80,"protocol":"TCP"}],"resources":{"limits":{"cpu":"500m","memory":"1Gi"}},"livenessProbe":{"httpGet":{"path":"/","port":"http","scheme":"HTTP"},"timeoutSeconds":1,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"Always"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","securityContext":{},"schedulerName":"default-scheduler","tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}],"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2024-01-02T03:04:06Z"}],"startTime":"2024-01-02T03:04:05Z","qosClass":"Burstable"}}"#;
    assert_eq!(round_trip(pod, Some(("Pod", "v1")), json).unwrap(), json);
}

/// An envelope, as etcd holds an object with the apiserver's default
/// storage media type, reads back as the object alone with its type meta;
/// anything else is refused.
#[test]
fn an_envelope_reads_back_as_the_object_with_its_kind() {
    let mut checked = 0;
    for (m, type_meta, json) in recorded() {
        let Some((kind, api_version)) = type_meta else {
            continue;
        };
        let mut raw = Vec::new();
        transcode(json.as_bytes(), m, &mut raw).unwrap();
        let (envelope, _) = crate::protobuf::envelope(&api_version, &kind, &raw);
        let back = crate::protobuf::object_json(&envelope).unwrap();
        assert_eq!(String::from_utf8(back).unwrap(), json, "{kind}");
        checked += 1;
    }
    assert!(checked >= 3, "{checked}");
    assert!(crate::protobuf::object_json(b"{\"kind\":\"Pod\"}").is_err());
    let (unknown, _) = crate::protobuf::envelope("example.com/v1", "Widget", b"");
    assert!(crate::protobuf::object_json(&unknown).is_err());
}
